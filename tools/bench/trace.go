package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/tracex"
)

// traceModes are the tracing group's runs: off, on (every trace sampled), and on with every
// incoming trace unsampled (its spans are not recorded; the trace context still goes through).
var traceModes = []string{"off", "on", "unsampled"}

// traceGroup measures what tracing costs on the router's default path end to end: the same
// preloaded orders, each record with a traceparent header (a traced producer), through the
// parallel subscriber, group commit (the coupon granter's HandleBatch) and the exactly-once
// relay, with tracing off (no tracer provider: otel.exporter none, the default) and on (an
// SDK tracer provider, parent-based sampling as the router's, its spans batched — the
// router's processor, default settings — to an exporter that discards them: the cost of
// making the spans, not of shipping them), the records' traces sampled (on) or not
// (unsampled). -trace-rounds rounds, each starting with the next mode; medians, and the
// overheads against off.
func (s *suite) traceGroup(ctx context.Context) error {
	s.calibrate("before_tracing")
	tput := map[string][]float64{}
	cpu, own := map[string][]float64{}, map[string][]float64{} // CPU µs per order: all three processes; the bench's alone
	for r := 1; r <= s.cfg.traceRounds; r++ {
		s.round = r
		k := (r - 1) % len(traceModes)
		modes := append(slices.Clone(traceModes[k:]), traceModes[:k]...)
		for _, mode := range modes {
			perS, cpuUs, ownUs, err := s.benchTraced(ctx, mode, s.cfg.traceOrders)
			if err != nil {
				return fmt.Errorf("tracing %s: %w", mode, err)
			}
			tput[mode], cpu[mode], own[mode] = append(tput[mode], perS), append(cpu[mode], cpuUs), append(own[mode], ownUs)
		}
	}
	s.round = 0
	for _, mode := range traceModes {
		kv := []any{"mode", mode, "orders_per_s", median(tput[mode]), "min", slices.Min(tput[mode]), "max", slices.Max(tput[mode]),
			"total_cpu_us_per_order", median(cpu[mode]), "bench_cpu_us_per_order", median(own[mode]), "rounds", s.cfg.traceRounds, "orders", s.cfg.traceOrders}
		if mode != "off" {
			off, on := median(tput["off"]), median(tput[mode])
			kv = append(kv, "overhead_pct", (off-on)/off*100,
				"cpu_overhead_pct", (median(cpu[mode])-median(cpu["off"]))/median(cpu["off"])*100,
				"bench_cpu_added_us_per_order", median(own[mode])-median(own["off"]))
		}
		s.report("tracing", kv...)
	}
	return nil
}

// benchTraced is one run of traceGroup: n preloaded orders drained end to end in mode. It
// returns orders/s, the CPU µs per order of MariaDB, Kafka and this process together, and
// this process's alone (where the spans are made).
func (s *suite) benchTraced(ctx context.Context, mode string, n int) (perS, total, own float64, err error) {
	db, kc := s.db, s.kc
	e := &e2eRun{s: s, mode: "batch", traced: true, unsampled: mode == "unsampled"}
	var spans discardSpans
	var tp *sdktrace.TracerProvider
	if mode != "off" {
		tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(&spans),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		e.tp = tp
	}
	if err = s.truncate(ctx); err != nil {
		return 0, 0, 0, err
	}
	in, cleanIn, err := makeTopic(kc, "bench-trace-in", int32(s.cfg.e2eParts))
	if err != nil {
		return 0, 0, 0, err
	}
	defer cleanIn()
	out, cleanOut, err := makeTopic(kc, "bench-trace-out", int32(s.cfg.e2eParts))
	if err != nil {
		return 0, 0, 0, err
	}
	defer cleanOut()
	h, _, closeH, err := s.coupon(ctx, out, false)
	if err != nil {
		return 0, 0, 0, err
	}
	defer closeH()
	icfg := engine.Config{BizType: coupon.BizType, StepsPerTx: s.cfg.e2eSPT}
	if tp != nil {
		icfg.TracerProvider = tp
	}
	ib, err := engine.New(db, h, icfg, nil, &e.wake)
	if err != nil {
		return 0, 0, 0, err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return 0, 0, 0, err
	}
	defer producer.Close()
	if err := e.produceOrders(producer, in, "trace", 0, n, 0); err != nil {
		return 0, 0, 0, err
	}
	w, err := watch(kc, out)
	if err != nil {
		return 0, 0, 0, err
	}
	defer w.close()
	stop, err := e.startPipeline(ctx, in, ib)
	if err != nil {
		return 0, 0, 0, err
	}
	meter := newCPUMeter(s.services)
	start := time.Now()
	err = w.wait(n, 5*time.Minute)
	el := time.Since(start)
	kv := meter.perOrder(n)
	stop()
	if err == nil {
		err = checkGranted(ctx, db, n)
	}
	if err != nil {
		return 0, 0, 0, err
	}
	if tp != nil {
		if err := tp.ForceFlush(ctx); err != nil {
			return 0, 0, 0, err
		}
	}
	perS = float64(n) / el.Seconds()
	for i := 0; i+1 < len(kv); i += 2 {
		switch kv[i] {
		case "total_cpu_us_per_order":
			total = kv[i+1].(float64)
		case "bench_cpu_us_per_order":
			own = kv[i+1].(float64)
		}
	}
	s.report("tracing", append([]any{"mode", mode, "orders_per_s", perS, "orders", n, "spans_per_order", float64(spans.n.Load()) / float64(n)}, kv...)...)
	return perS, total, own, nil
}

// discardSpans is a span exporter that counts the spans it is given and drops them.
type discardSpans struct{ n atomic.Int64 }

func (d *discardSpans) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	d.n.Add(int64(len(spans)))
	return nil
}

func (d *discardSpans) Shutdown(context.Context) error { return nil }

// traceParentOf is order i's traceparent: a trace of its own per order and process.
func traceParentOf(i int, sampled bool) string {
	var c trace.SpanContextConfig
	binary.BigEndian.PutUint64(c.TraceID[:8], uint64(benchStart))
	binary.BigEndian.PutUint64(c.TraceID[8:], uint64(i)+1)
	binary.BigEndian.PutUint64(c.SpanID[:], uint64(i)+1)
	if sampled {
		c.TraceFlags = trace.FlagsSampled
	}
	return tracex.TraceParent(trace.NewSpanContext(c))
}

// benchStart tells this process's traces from an earlier run's.
var benchStart = time.Now().UnixNano()

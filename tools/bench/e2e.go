package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// e2eGroup runs the end-to-end measurements: group commit -rounds times (with -e2e-coupon
// batch,plain, each round runs the coupon plugin through its HandleBatch and through only
// its plain contract, back to back, alternating which goes first), then the medians of the
// rounds; then one delivery per transaction once (unless -e2e-orders 0).
func (s *suite) e2eGroup(ctx context.Context) error {
	s.calibrate("before_e2e")
	type runs struct {
		tput, steady         []float64
		p50s, p99s, achieved map[int][]float64
	}
	variants := splitList(s.cfg.e2eCoupon)
	got := map[string]*runs{}
	for _, v := range variants {
		got[v] = &runs{p50s: map[int][]float64{}, p99s: map[int][]float64{}, achieved: map[int][]float64{}}
	}
	for r := 1; r <= s.cfg.rounds; r++ {
		s.round = r
		seq := slices.Clone(variants)
		if r%2 == 0 {
			slices.Reverse(seq)
		}
		for _, v := range seq {
			res, err := s.benchE2E(ctx, "batch", v == "plain", s.cfg.e2eBatchN, s.cfg.batchLoads)
			if err != nil {
				return fmt.Errorf("e2e batch (coupon %s): %w", v, err)
			}
			g := got[v]
			g.tput, g.steady = append(g.tput, res.ordersPerS), append(g.steady, res.steadyPerS)
			for load, l := range res.lat {
				g.p50s[load], g.p99s[load], g.achieved[load] = append(g.p50s[load], l[0]), append(g.p99s[load], l[1]), append(g.achieved[load], l[2])
			}
		}
	}
	s.round = 0
	rounds := s.cfg.rounds
	for _, v := range variants {
		g, mode := got[v], e2eMode("batch", v == "plain")
		s.report("e2e", "mode", mode, "orders_per_s", median(g.tput), "min", slices.Min(g.tput), "max", slices.Max(g.tput), "rounds", rounds, "offered", "preloaded",
			"steady_orders_per_s", median(g.steady), "steady_min", slices.Min(g.steady), "steady_max", slices.Max(g.steady))
		for _, load := range splitInts(s.cfg.batchLoads) {
			s.report("e2e", "mode", mode, "offered_per_s", load, "orders_per_s", median(g.achieved[load]), "p50_ms", median(g.p50s[load]), "p99_ms", median(g.p99s[load]),
				"p99_min", slices.Min(g.p99s[load]), "p99_max", slices.Max(g.p99s[load]), "rounds", rounds)
		}
	}
	if b, p := got["batch"], got["plain"]; b != nil && p != nil {
		var rs []float64
		for i := range b.tput {
			rs = append(rs, b.tput[i]/max(p.tput[i], 1))
		}
		s.report("ratio", "mode", "e2e_coupon_batch_vs_plain_by_round", "median", median(rs), "min", slices.Min(rs), "max", slices.Max(rs), "rounds", len(rs))
	}
	if s.cfg.e2eN > 0 {
		if _, err := s.benchE2E(ctx, "single", false, s.cfg.e2eN, s.cfg.loads); err != nil {
			return fmt.Errorf("e2e single: %w", err)
		}
	}
	return nil
}

// e2eMode is the mode an e2e line reports: mode, or mode_plain for the coupon plugin
// without its HandleBatch.
func e2eMode(mode string, contract bool) string {
	if contract {
		return mode + "_plain"
	}
	return mode
}

// e2eResult is what one benchE2E run measured: preloaded throughput, and p50/p99 per load.
type e2eResult struct {
	ordersPerS float64
	steadyPerS float64            // from the first finished delivery (the router's start left out)
	dbCPU      float64            // the database server's CPU µs per order of the throughput run
	lat        map[int][3]float64 // p50, p99, achieved orders/s
}

// e2eRun is one benchE2E: its pipeline's waker, and when each order of its latency runs
// was produced and handed to the handler.
type e2eRun struct {
	s        *suite
	mode     string
	contract bool // the coupon plugin's handler without its HandleBatch (suite.coupon)
	wake     waker
	// tp traces the relay (the inbox's is its Config's); nil: no tracing. traced gives each
	// produced order a traceparent header, sampled unless unsampled. The tracing group
	// (trace.go) sets them.
	tp                trace.TracerProvider
	traced, unsampled bool
	// When the producer's request with each order of a latency run returned (the broker
	// has it), and, with -latency-dump, when each order was first handed to the handler.
	producedAt, handedAt sync.Map
}

// benchE2E: order-paid in → coupon-granted visible to a read_committed consumer, through
// the Watermill router, the inbox and the exactly-once relay, all in this process. Mode
// "batch" is the router's default (parallel subscriber, group commit); "single" is
// watermill-kafka's one-at-a-time subscriber and one delivery per transaction.
func (s *suite) benchE2E(ctx context.Context, mode string, contract bool, n int, loadList string) (e2eResult, error) {
	db, kc := s.db, s.kc
	e := &e2eRun{s: s, mode: mode, contract: contract}
	label := e2eMode(mode, contract)
	res := e2eResult{lat: map[int][3]float64{}}
	if err := s.truncate(ctx); err != nil {
		return res, err
	}
	in, cleanIn, err := makeTopic(kc, "bench-order-paid", int32(s.cfg.e2eParts))
	if err != nil {
		return res, err
	}
	defer cleanIn()
	out, cleanOut, err := makeTopic(kc, "bench-granted", int32(s.cfg.e2eParts))
	if err != nil {
		return res, err
	}
	defer cleanOut()
	h, _, closeH, err := s.coupon(ctx, out, e.contract)
	if err != nil {
		return res, err
	}
	defer closeH() // after the pipeline stops (deferred later, runs first)
	ib, err := engine.New(db, h, engine.Config{BizType: coupon.BizType, StepsPerTx: s.cfg.e2eSPT}, nil, &e.wake)
	if err != nil {
		return res, err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return res, err
	}
	defer producer.Close()

	// Throughput: pre-load the topic, then start the router and time the drain until a
	// read_committed consumer has seen every order's event.
	if err := e.produceOrders(producer, in, "e2e", 0, n, 0); err != nil {
		return res, err
	}
	w0, err := watch(kc, out)
	if err != nil {
		return res, err
	}
	stop, err := e.startPipeline(ctx, in, ib)
	if err != nil {
		w0.close()
		return res, err
	}
	cpu := newCPUMeter(s.services)
	start := time.Now()
	e.wake.first.Store(0)
	err = w0.wait(n, 5*time.Minute)
	el := time.Since(start)

	w0.close()
	if err == nil {
		err = checkGranted(ctx, db, n)
	}
	if err != nil {
		stop()
		return res, err
	}
	res.ordersPerS = float64(n) / el.Seconds()
	// The router's start (consumer group join, first fetch; ≈0.2–0.3 s) is inside el:
	// steady_orders_per_s runs from the first delivery the inbox finished instead.
	startMs := float64(e.wake.first.Load()-start.UnixNano()) / 1e6
	res.steadyPerS = float64(n) / (el.Seconds() - startMs/1000)
	s.report("e2e", "mode", label, "orders_per_s", res.ordersPerS, "orders", n, "offered", "preloaded",
		"start_ms", startMs, "steady_orders_per_s", res.steadyPerS)
	cpuKV := cpu.perOrder(n)
	res.dbCPU = cpuMap(cpuKV)["db_cpu_us_per_order"]
	s.report("e2e_cpu", append([]any{"mode", label}, cpuKV...)...)

	// Latency at offered loads: Kafka timestamp of the order (taken by this process's producer)
	// → this process's live read_committed consumer sees its CouponGranted event. Each load
	// first runs -warmup-seconds unmeasured (steady state: the throughput run's aftermath,
	// e.g. MariaDB purging its undo, is not charged to the first load).
	base, granted := n, n
	for _, rate := range splitInts(loadList) {
		count, warm := rate*s.cfg.loadSecs, rate*s.cfg.warmSecs
		w, err := watch(kc, out)
		if err != nil {
			stop()
			return res, err
		}
		if err := e.produceOrders(producer, in, "warm", base, warm, float64(rate)); err != nil {
			stop()
			return res, err
		}
		t0, lcpu := time.Now(), newCPUMeter(s.services)
		if err := e.produceOrders(producer, in, "lat", base, count, float64(rate)); err != nil {
			stop()
			return res, err
		}
		err = w.wait(warm+count, 5*time.Minute)
		achieved := float64(count) / time.Since(t0).Seconds()
		// CPU per order at this load (the measured orders and the warm-up's tail): at low
		// loads it is several times the full-load figure — per request, per transaction.
		lcpuKV := lcpu.perOrder(count)
		w.close()
		granted += warm + count
		if err == nil {
			err = checkGranted(ctx, db, granted)
		}
		if err != nil {
			stop()
			return res, err
		}
		p50, p99, measured, err := latencies(kc, in, w, "lat", base, base+count)
		if err != nil {
			stop()
			return res, err
		}
		res.lat[rate] = [3]float64{p50, p99, achieved}
		s.report("e2e", "mode", label, "offered_per_s", rate, "orders_per_s", achieved, "p50_ms", p50, "p99_ms", p99, "measured", measured)
		s.report("e2e_cpu", append([]any{"mode", label, "offered_per_s", rate}, lcpuKV...)...)
		if err := e.stages(ctx, in, w, rate, base, base+count); err != nil {
			stop()
			return res, err
		}
		base += count
	}
	stop()
	return res, nil
}

func splitInts(s string) []int {
	var out []int
	cur := 0
	has := false
	for _, c := range s + "," {
		if c >= '0' && c <= '9' {
			cur = cur*10 + int(c-'0')
			has = true
		} else if has {
			out = append(out, cur)
			cur, has = 0, false
		}
	}
	return out
}

// produceOrders sends orders from..from+n to topic: as fast as possible when rate is 0, else
// at rate orders/s — every 5 ms the orders then due go in one request (as a producer's
// linger would batch them), each stamped with the time it was due, so the wait is part of
// its measured latency. (One request per order cost the shared broker more CPU than the
// orders did.)
func (e *e2eRun) produceOrders(p sarama.SyncProducer, topic, prefix string, from, n int, rate float64) error {
	msg := func(i int) *sarama.ProducerMessage {
		o := order(prefix, i)
		m := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(o.Encode()),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}}
		if e.traced {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(tracex.Header), Value: []byte(traceParentOf(i, !e.unsampled))})
		}
		return m
	}
	if rate <= 0 {
		var batch []*sarama.ProducerMessage
		for i := from; i < from+n; i++ {
			if batch = append(batch, msg(i)); len(batch) >= 500 {
				if err := p.SendMessages(batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			return p.SendMessages(batch)
		}
		return nil
	}
	const tick = 5 * time.Millisecond
	start := time.Now()
	i := from
	for next := start.Add(tick); i < from+n; next = next.Add(tick) {
		time.Sleep(time.Until(next))
		// Everything due by now goes: after a slow request the generator catches up at once
		// (sending one tick's orders per request, it had fallen behind for good whenever a
		// request took longer than a tick, and measured its own lag as the pipeline's).
		upTo := time.Now()
		if upTo.Before(next) {
			upTo = next
		}
		next = upTo
		var batch []*sarama.ProducerMessage
		for ; i < from+n; i++ {
			due := start.Add(time.Duration(float64(i-from+1) / rate * float64(time.Second)))
			if due.After(upTo) {
				break
			}
			m := msg(i)
			m.Timestamp = due
			batch = append(batch, m)
		}
		if len(batch) > 0 {
			if err := p.SendMessages(batch); err != nil {
				return err
			}
			now := time.Now()
			for _, m := range batch {
				e.producedAt.Store(string(m.Key.(sarama.StringEncoder)), now)
			}
		}
	}
	return nil
}

// waker wakes the pipeline's relay after every delivery that committed work, as the
// router does, and notes when the pipeline first finished a delivery.
type waker struct {
	relay atomic.Pointer[outbox.Relay]
	first atomic.Int64 // Unix ns of the first finished delivery; 0 until then
}

func (w *waker) Delivered(_ string, r engine.Result, _ time.Duration) {
	w.first.CompareAndSwap(0, time.Now().UnixNano())
	if rl := w.relay.Load(); rl != nil && r.Outcome == engine.OutcomeProcessed {
		rl.Wake()
	}
}

func (e *e2eRun) startPipeline(ctx context.Context, topic string, ib *engine.Inbox) (func(), error) {
	s, db, kc := e.s, e.s.db, e.s.kc
	var sub message.Subscriber
	var err error
	handler := ib.HandlerFunc(topic)
	var deliver kafkax.DeliverFunc // group commit: the router binary's consumer loop, not Watermill's router
	closeBatcher := func() {}
	if e.mode == "batch" {
		sub, err = kc.NewParallelSubscriber("bench-"+topic, kafkax.ParallelConfig{}, watermill.NopLogger{})
		if err != nil {
			return nil, err
		}
		b, err := ib.NewBatcher(s.batchConfig())
		if err != nil {
			return nil, err
		}
		deliver = func(msg *message.Message, done func(error)) { b.Deliver(msg, topic, done) }
		closeBatcher = func() {
			_ = b.Close()
			// Deliveries the batches did not finish ran one at a time: a diagnosis line.
			st := b.Stats()
			s.report("e2e_batches", "batches", st.Batches, "avg_batch", float64(st.Batched)/float64(max(st.Batches, 1)),
				"fallbacks", st.Fallbacks, "rollbacks", st.Rollbacks)
		}
	} else if sub, err = kc.NewSubscriber("bench-"+topic, watermill.NopLogger{}); err != nil {
		return nil, err
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	r.AddMiddleware(kafkax.AckOnReturn) // the one-at-a-time path, on a team's own router
	e.producedAt.Clear()
	if s.cfg.latencyDump != "" {
		// -latency-dump splits Kafka → inbox claim at the moment the subscriber hands an order
		// to the handler (the decode costs CPU, so only when asked).
		e.handedAt.Clear()
		handed := func(msg *message.Message) {
			var o struct {
				OrderID string `json:"orderId"`
			}
			if json.Unmarshal(msg.Payload, &o) == nil {
				e.handedAt.LoadOrStore(o.OrderID, time.Now())
			}
		}
		if inner := deliver; inner != nil {
			deliver = func(msg *message.Message, done func(error)) { handed(msg); inner(msg, done) }
		} else {
			inner := handler
			handler = func(msg *message.Message) error { handed(msg); return inner(msg) }
		}
	}
	if deliver == nil {
		r.AddConsumerHandler("bench", topic, sub, handler)
	}
	// The router's default relay: exactly once (transactional producer, positions, lease),
	// with configs/router.yaml's batch size and linger, woken after each committed delivery.
	positions, dropPositions := positionsTopic(kc)
	relay, err := outbox.NewExactlyOnceRelay(db, kc, outbox.RelayConfig{Shards: s.cfg.e2eShards, Shard: "e2e",
		BatchSize: 2000, Linger: s.cfg.e2eLinger, PositionsTopic: positions, TracerProvider: e.tp,
		TransactionalID: fmt.Sprintf("bench-e2e-%d", time.Now().UnixNano())}, nil)
	if err != nil {
		return nil, err
	}
	e.wake.relay.Store(relay)
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = relay.Run(cctx) }()
	if deliver != nil {
		go func() { defer wg.Done(); _ = kafkax.Consume(cctx, sub, topic, "bench", deliver, watermill.NopLogger{}) }()
	} else {
		go func() { defer wg.Done(); _ = r.Run(cctx) }()
		<-r.Running()
	}
	return func() {
		cancel()
		wg.Wait()
		if deliver != nil {
			_ = sub.Close() // the router closes its own
		}
		closeBatcher()
		// Which batches the relay took from the hand-off (handoff.go): a diagnosis line.
		if h := relay.HandOff(); e.mode == "batch" {
			s.report("e2e_handoff", "handed", h.Handed, "full", h.Full, "handoff_batches", h.Batches, "readback_batches", h.ReadBack)
		}
		_ = relay.Close()
		dropPositions()
	}, nil
}

// checkGranted confirms, once a run's events were all seen, that the database agrees: want
// grants and nothing left unpublished. The relay marks a batch published just after its
// Kafka commit, which the watcher may see first: unpublished rows get a few seconds to be
// marked. (Runs wait on the watcher, not on this query: polled, its index scans took a
// sizeable share of the 2 cores the pipeline runs on.)
func checkGranted(ctx context.Context, db *sql.DB, want int) error {
	var granted, pending int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM coupon_grant WHERE state = 'GRANTED'), (SELECT COUNT(*) FROM outbox WHERE published_at IS NULL)").Scan(&granted, &pending); err != nil {
			return err
		}
		if granted != want || pending == 0 || time.Now().After(deadline) {
			break
		}
	}
	if granted != want || pending != 0 {
		return fmt.Errorf("all events seen, but the database has %d grants (want %d) and %d unpublished events", granted, want, pending)
	}
	return nil
}

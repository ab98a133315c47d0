package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
)

// batchGroup measures group commit (engine.Batcher): many deliveries per transaction,
// multi-row statements. Two baselines: the handler alone on pre-built batches (a ceiling),
// and the same delivery path as the Batcher's without the inbox (the overhead baseline).
// Run in -batch-rounds back-to-back triples; the overhead is the median of the rounds'
// overheads, and pooled: 1 − (the baseline's total time) / (the inbox's total time).
// Odd rounds run the baseline before the inbox, even rounds after it, so neither always
// inherits the other's background work (InnoDB flushing the last run's pages). Many short
// rounds (15 of 15,000 orders) rather than a few long ones: the machine's speed drifts over
// seconds, and the two sides of a short round see the same speed.
func (s *suite) batchGroup(ctx context.Context) error {
	var hs, us, is, ohU, ohH []float64
	var tU, tI float64       // total seconds, for the pooled overhead
	var cpuU, cpuI []float64 // CPU µs per order of each round (all processes): on a CPU-bound
	// machine 1 − CPU_baseline/CPU_inbox is the throughput the inbox costs, and CPU time
	// does not count the waits in which the machine's drift shows most
	n := s.cfg.batchOrders
	for r := 1; r <= s.cfg.batchRounds; r++ {
		s.round = r
		h, err := s.benchUnsafeBatch(ctx)
		if err != nil {
			return fmt.Errorf("unsafe batch: %w", err)
		}
		var u, i float64
		var printInbox func(unsafe, handlerOnly float64)
		for _, inboxFirst := range []bool{r%2 == 0, r%2 == 1} {
			if inboxFirst {
				var ib inboxBatchRun
				if ib, err = s.benchInboxBatch(ctx); err != nil {
					return fmt.Errorf("inbox batch: %w", err)
				}
				i, printInbox = ib.rate, ib.print
				cpuI = append(cpuI, ib.cpu)
			} else {
				var cpu float64
				if u, cpu, err = s.benchUnsafeSamePath(ctx); err != nil {
					return fmt.Errorf("unsafe batch: %w", err)
				}
				cpuU = append(cpuU, cpu)
			}
		}
		printInbox(u, h)
		hs, us, is = append(hs, h), append(us, u), append(is, i)
		ohU, ohH = append(ohU, (u-i)/u*100), append(ohH, (h-i)/h*100)
		tU, tI = tU+float64(n)/u, tI+float64(n)/i
	}
	s.round = 0
	rounds := s.cfg.batchRounds
	s.report("unsafe", "mode", "handler_only", "orders_per_s", median(hs), "min", slices.Min(hs), "max", slices.Max(hs), "rounds", rounds)
	s.report("unsafe", "mode", "batch", "orders_per_s", median(us), "min", slices.Min(us), "max", slices.Max(us), "rounds", rounds)
	s.report("inbox", "mode", "batch", "orders_per_s", median(is), "min", slices.Min(is), "max", slices.Max(is), "rounds", rounds,
		"overhead_pct_vs_unsafe", median(ohU), "overhead_min", slices.Min(ohU), "overhead_max", slices.Max(ohU),
		"overhead_pooled_pct", (1-tU/tI)*100, "overhead_cpu_pct", (1-median(cpuU)/median(cpuI))*100,
		"overhead_pct_vs_handler_only", median(ohH))
	return nil
}

// benchUnsafeBatch: the batched handler alone — the same multi-row grant statements, one
// transaction per batch-size orders, on batches built beforehand: no messages, no decode,
// no dedup record. A ceiling for the group-commit path ("handler_only"); its overhead
// baseline is benchUnsafeSamePath.
func (s *suite) benchUnsafeBatch(ctx context.Context) (float64, error) {
	if err := s.truncate(ctx); err != nil {
		return 0, err
	}
	h, _, closeH, err := s.coupon(ctx, "", false)
	if err != nil {
		return 0, err
	}
	defer closeH()
	n, size := s.cfg.batchOrders, s.cfg.batchSize
	batches := (n + size - 1) / size
	defer s.withWorkers(s.cfg.batchLanes)()
	cpu := newCPUMeter(s.services)
	el, err := s.parallel(batches, func(b int) error {
		var ds []*inbox.Delivery
		for i := b * size; i < min(n, (b+1)*size); i++ {
			o := order("unsafe-batch", i)
			ds = append(ds, &inbox.Delivery{Key: o.OrderID, Value: o})
		}
		return grantBatch(ctx, s.db, h.(inbox.BatchHandler), ds)
	})
	if err != nil {
		return 0, err
	}
	rate := float64(n) / el.Seconds()
	s.report("unsafe", append([]any{"mode", "handler_only", "batch_size", size, "orders_per_s", rate, "orders", n, "seconds", el.Seconds()}, cpu.perOrder(n)...)...)
	return rate, nil
}

// benchInboxBatch: every order through the Batcher (inbox claim, handler, done mark in
// shared transactions), offered by many concurrent senders like a router's in-flight
// messages, then 30 % duplicate deliveries. Its line is printed by the run's print, once
// the round's baselines are known (rounds alternate which runs first).
func (s *suite) benchInboxBatch(ctx context.Context) (inboxBatchRun, error) {
	if err := s.truncate(ctx); err != nil {
		return inboxBatchRun{}, err
	}
	b, cfg, closeBatcher, err := s.newBatcher(ctx, false)
	if err != nil {
		return inboxBatchRun{}, err
	}
	defer closeBatcher()
	n := s.cfg.batchOrders
	defer s.withWorkers(s.cfg.batchSenders)()
	send := func(i int) error {
		o := order("batch", i)
		_, err := b.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"})
		return err
	}
	cpu := newCPUMeter(s.services)
	el, err := s.parallel(n, send)
	if err != nil {
		return inboxBatchRun{}, err
	}
	cpuKV := cpu.perOrder(n)
	rate := float64(n) / el.Seconds()
	dups := n * 3 / 10
	del, err := s.parallel(dups, func(i int) error { return send(i * 3) })
	if err != nil {
		return inboxBatchRun{}, err
	}
	a, err := coupon.Verify(ctx, s.db, cfg.CampaignID, time.Hour)
	if err != nil {
		return inboxBatchRun{}, err
	}
	if a.DuplicateCoupons > 0 || len(a.Violations) > 0 {
		return inboxBatchRun{}, fmt.Errorf("the audit failed: %d duplicate coupons, violations %v", a.DuplicateCoupons, a.Violations)
	}
	st := b.Stats()
	printLines := func(unsafe, handlerOnly float64) {
		overhead := func(base float64) float64 { return (base - rate) / max(base, 1) * 100 }
		s.report("inbox", "mode", "batch", "batch_size", s.cfg.batchSize, "orders_per_s", rate, "overhead_pct_vs_unsafe", overhead(unsafe), "overhead_pct_vs_handler_only", overhead(handlerOnly),
			"duplicates_per_s", float64(dups)/del.Seconds(), "coupons", a.Coupons, "duplicate_coupons", a.DuplicateCoupons,
			"avg_batch", float64(st.Batched)/float64(max(st.Batches, 1)), "fallbacks", st.Fallbacks, "violations", len(a.Violations), "returning", st.Returning)
		s.report("inbox_cpu", append([]any{"mode", "batch"}, cpuKV...)...)
	}
	return inboxBatchRun{rate: rate, cpu: cpuMap(cpuKV)["total_cpu_us_per_order"], dbCPU: cpuMap(cpuKV)["db_cpu_us_per_order"], print: printLines}, nil
}

// inboxBatchRun is one benchInboxBatch: orders/s, CPU µs per order (all processes), and
// what prints its lines.
type inboxBatchRun struct {
	rate, cpu, dbCPU float64
	print            func(unsafe, handlerOnly float64)
}

// newBatcher builds the coupon plugin's group-commit path (the router's default) on a
// fresh campaign, as the measurements of that path use it; contract: the plugin's handler
// without its HandleBatch (see suite.coupon). Call the returned func when done: it closes
// the Batcher, then the handler's prepared statements (left open, each round's would pile
// up on the pool's connections).
func (s *suite) newBatcher(ctx context.Context, contract bool) (*engine.Batcher, coupon.Config, func(), error) {
	h, cfg, closeH, err := s.coupon(ctx, "", contract)
	if err != nil {
		return nil, cfg, nil, err
	}
	ib, err := engine.New(s.db, h, engine.Config{BizType: coupon.BizType}, nil, nil)
	if err != nil {
		closeH()
		return nil, cfg, nil, err
	}
	b, err := ib.NewBatcher(s.batchConfig())
	if err != nil {
		closeH()
		return nil, cfg, nil, err
	}
	return b, cfg, func() { _ = b.Close(); closeH() }, nil
}

// batchConfig is the Batcher settings of the group-commit measurements.
func (s *suite) batchConfig() engine.BatchConfig {
	return engine.BatchConfig{MaxSize: s.cfg.batchSize, Workers: s.cfg.batchLanes, Linger: s.cfg.batchLinger}
}

package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
)

var (
	batchSize    = flag.Int("batch-size", 512, "inbox.batch_size of the group-commit measurements")
	batchLanes   = flag.Int("batch-workers", 2, "inbox.batch_workers of the group-commit measurements")
	batchLinger  = flag.Duration("batch-linger", 0, "inbox.batch_linger of the group-commit measurements (0: the default, 2ms)")
	batchOrders  = flag.Int("batch-orders", 15000, "orders per group-commit database measurement")
	batchRounds  = flag.Int("batch-rounds", 15, "rounds of the group-commit measurements (baseline and inbox back to back, alternating which goes first); medians reported, and the overhead also pooled over all rounds")
	batchSenders = flag.Int("batch-senders", 2048, "concurrent deliveries offered to the Batcher (a router's in-flight messages)")
)

// benchUnsafeBatch: the batched handler alone — the same multi-row grant statements, one
// transaction per batch-size orders, on batches built beforehand: no messages, no decode,
// no dedup record. A ceiling for the group-commit path ("handler_only"); its overhead
// baseline is benchUnsafeSamePath.
func benchUnsafeBatch(ctx context.Context, db *sql.DB) (float64, error) {
	if err := truncate(ctx); err != nil {
		return 0, err
	}
	g, _, err := granter(ctx, db, "")
	if err != nil {
		return 0, err
	}
	defer g.Close()
	n := *batchOrders
	batches := (n + *batchSize - 1) / *batchSize
	defer withWorkers(*batchLanes)()
	cpu := newCPUMeter()
	el, err := parallel(batches, func(b int) error {
		var ds []*inbox.Delivery
		for i := b * *batchSize; i < min(n, (b+1)**batchSize); i++ {
			o := order("unsafe-batch", i)
			ds = append(ds, &inbox.Delivery{Key: o.OrderID, Value: o})
		}
		return grantBatch(ctx, db, g, ds)
	})
	if err != nil {
		return 0, err
	}
	rate := float64(n) / el.Seconds()
	report("unsafe", append([]any{"mode", "handler_only", "batch_size", *batchSize, "orders_per_s", rate, "orders", n, "seconds", el.Seconds()}, cpu.perOrder(n)...)...)
	return rate, nil
}

// benchInboxBatch: every order through the Batcher (inbox claim, handler, done mark in
// shared transactions), offered by many concurrent senders like a router's in-flight
// messages, then 30 % duplicate deliveries. Its line is printed by the returned func, once
// the round's baselines are known (rounds alternate which runs first).
func benchInboxBatch(ctx context.Context, db *sql.DB) (float64, func(unsafe, handlerOnly float64), error) {
	if err := truncate(ctx); err != nil {
		return 0, nil, err
	}
	b, cfg, closeBatcher, err := newBatcher(ctx, db)
	if err != nil {
		return 0, nil, err
	}
	defer closeBatcher()
	n := *batchOrders
	defer withWorkers(*batchSenders)()
	send := func(i int) error {
		o := order("batch", i)
		_, err := b.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"})
		return err
	}
	cpu := newCPUMeter()
	el, err := parallel(n, send)
	if err != nil {
		return 0, nil, err
	}
	cpuKV := cpu.perOrder(n)
	rate := float64(n) / el.Seconds()
	dups := n * 3 / 10
	del, err := parallel(dups, func(i int) error { return send(i * 3) })
	if err != nil {
		return 0, nil, err
	}
	a, err := coupon.Verify(ctx, db, cfg.CampaignID, time.Hour)
	if err != nil {
		return 0, nil, err
	}
	if a.DuplicateCoupons > 0 || len(a.Violations) > 0 {
		return 0, nil, fmt.Errorf("the audit failed: %d duplicate coupons, violations %v", a.DuplicateCoupons, a.Violations)
	}
	st := b.Stats()
	return rate, func(unsafe, handlerOnly float64) {
		overhead := func(base float64) float64 { return (base - rate) / max(base, 1) * 100 }
		report("inbox", "mode", "batch", "batch_size", *batchSize, "orders_per_s", rate, "overhead_pct_vs_unsafe", overhead(unsafe), "overhead_pct_vs_handler_only", overhead(handlerOnly),
			"duplicates_per_s", float64(dups)/del.Seconds(), "coupons", a.Coupons, "duplicate_coupons", a.DuplicateCoupons,
			"avg_batch", float64(st.Batched)/float64(max(st.Batches, 1)), "fallbacks", st.Fallbacks, "violations", len(a.Violations), "returning", st.Returning)
		report("inbox_cpu", append([]any{"mode", "batch"}, cpuKV...)...)
	}, nil
}

// newBatcher builds the coupon granter's group-commit path (the router's default) on a
// fresh campaign, as the measurements of that path use it.
// Close the returned func when done: it closes the Batcher, then the granter's prepared
// statements (left open, each round's would pile up on the pool's connections).
func newBatcher(ctx context.Context, db *sql.DB) (*inbox.Batcher, coupon.Config, func(), error) {
	g, cfg, err := granter(ctx, db, "")
	if err != nil {
		return nil, cfg, nil, err
	}
	ib, err := inbox.New(db, g, inbox.Config{BizType: coupon.BizType}, nil, nil)
	if err != nil {
		_ = g.Close()
		return nil, cfg, nil, err
	}
	b, err := ib.NewBatcher(inbox.BatchConfig{MaxSize: *batchSize, Workers: *batchLanes, Linger: *batchLinger})
	if err != nil {
		_ = g.Close()
		return nil, cfg, nil, err
	}
	return b, cfg, func() { _ = b.Close(); _ = g.Close() }, nil
}

// withWorkers sets how many goroutines parallel uses; the returned func restores it.
func withWorkers(n int) (restore func()) {
	saved := *workers
	*workers = n
	return func() { *workers = saved }
}

var (
	cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	memProfile = flag.String("memprofile", "", "write an allocation profile of the whole run to this file (go tool pprof -sample_index=alloc_space)")
)

// startProfile starts the CPU profile when -cpuprofile is set; the returned func stops it
// and writes the allocation profile when -memprofile is set.
func startProfile() (func(), error) {
	stop := func() {
		if *memProfile == "" {
			return
		}
		if f, err := os.Create(*memProfile); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	if *cpuProfile == "" {
		return stop, nil
	}
	f, err := os.Create(*cpuProfile)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close(); stop() }, nil
}

var only = flag.String("only", "", "run only these measurement groups (comma separated: batch, plain, single, storm, relay, e2e, seed); empty runs all")

// want reports whether the measurement group runs in this invocation.
func want(group string) bool {
	if *only == "" {
		return true
	}
	for _, g := range strings.Split(*only, ",") {
		if strings.TrimSpace(g) == group {
			return true
		}
	}
	return false
}

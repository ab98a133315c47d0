package engine_test

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// BenchmarkBatcherProcess measures the Batcher's per-delivery path on the real database.
// It makes concurrent deliveries of new orders, as the router's handler goroutines make
// them, group committed. The messages are made before the timer starts. So -benchmem's
// allocs/op is what a delivery costs the inbox and its handler. It runs with the coupon
// plugin's BatchHandler, the router's path, and with a handler that does nothing, the
// inbox's own share.
func BenchmarkBatcherProcess(b *testing.B) {
	testenv.Integration(b)
	for _, tc := range []struct {
		name   string
		plugin bool
		wrap   func(inbox.Handler) inbox.Handler
	}{
		{name: "coupon", plugin: true},
		{name: "noop", wrap: func(inbox.Handler) inbox.Handler { return noopBatchHandler{} }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := newPipeline(b, pipelineOpts{conns: 8, outage: true, plugin: tc.plugin, wrap: tc.wrap})
			bt, err := p.inbox.NewBatcher(engine.BatchConfig{})
			if err != nil {
				b.Fatal(err)
			}
			defer bt.Close()
			msgs := make([]*message.Message, b.N)
			for i := range msgs {
				msgs[i] = orderMsg(fmt.Sprintf("bench-%d", i), fmt.Sprintf("user-%d", i%1000))
				msgs[i].Metadata = message.Metadata{} // as the Kafka subscriber leaves it (no headers but the id)
			}
			var next atomic.Int64
			b.SetParallelism(64) // the router runs a goroutine per message in flight
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					i := next.Add(1) - 1
					res, err := bt.Process(ctx, msgs[i], inbox.Source{Topic: "bench-orders", Partition: int32(i % 12), Offset: i})
					if err != nil {
						b.Error(err)
						return
					}
					if res.Outcome != engine.OutcomeProcessed {
						b.Errorf("delivery %d: %s, want processed", i, res.Outcome)
						return
					}
				}
			})
			b.StopTimer()
			st := bt.Stats()
			if st.Batches > 0 {
				b.ReportMetric(float64(st.Batched)/float64(st.Batches), "deliveries/batch")
			}
		})
	}
}

// TestBatcherAllocsPerDelivery bounds what a delivery of a full batch allocates in the
// inbox's own path, with a handler that does nothing. It counts one batch of 256 new
// orders, from when their callers start until every one has its outcome. The count does
// not depend on timing, because the batch goes when it is full.
func TestBatcherAllocsPerDelivery(t *testing.T) {
	testenv.Integration(t)
	// The MySQL family's bound leaves some room above its path's count. A closure per row
	// and every argument boxed per row would exceed it. PostgreSQL's driver, pgx, encodes
	// each argument on its own, so PostgreSQL's bound is higher.
	const n = 256
	most := 20.0
	if testenv.Dialect().IsPostgres() {
		most = 32
	}
	p := newPipeline(t, pipelineOpts{conns: 4, outage: true, wrap: func(inbox.Handler) inbox.Handler { return noopBatchHandler{} }})
	bt, err := p.inbox.NewBatcher(engine.BatchConfig{MaxSize: n, Linger: time.Second, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer bt.Close()
	// A first batch warms the pool's connection and the claim's prepared statement.
	run := func(prefix string) (mallocs uint64) {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = orderMsg(fmt.Sprintf("%s-%d", prefix, i), "u")
			msgs[i].Metadata = message.Metadata{}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				<-start
				res, err := bt.Process(context.Background(), msgs[i], inbox.Source{Topic: "orders", Partition: 1, Offset: int64(1000 + i)})
				if err == nil && res.Outcome != engine.OutcomeProcessed {
					err = fmt.Errorf("outcome %s", res.Outcome)
				}
				errs[i] = err
			})
		}
		runtime.Gosched()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		close(start)
		wg.Wait()
		runtime.ReadMemStats(&after)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("delivery %d: %v", i, err)
			}
		}
		return after.Mallocs - before.Mallocs
	}
	run("warm")
	batches := bt.Stats().Batches
	m := run("measured")
	// There is one batch, unless the callers took over a Linger to arrive on a loaded
	// host. A few batches only add their fixed costs.
	batches = bt.Stats().Batches - batches
	if per := float64(m) / n; per > most {
		t.Errorf("%.1f allocations per delivery (%d batches), want at most %.0f", per, batches, most)
	} else {
		t.Logf("%.1f allocations per delivery (%d batches)", per, batches)
	}
}

// noopBatchHandler finishes every delivery without writing anything of its own.
type noopBatchHandler struct{}

func (noopBatchHandler) Decode(m *message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{Key: m.UUID}, nil
}

func (noopBatchHandler) Handle(context.Context, *sql.Tx, *inbox.Delivery) (inbox.Progress, error) {
	return inbox.Done, nil
}

func (noopBatchHandler) HandleBatch(_ context.Context, _ *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	ps := make([]inbox.Progress, len(ds))
	for i := range ps {
		ps[i] = inbox.Done
	}
	return ps, nil
}

package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox/engine"
)

// deliverAll hands msgs to b.Deliver from one goroutine, as a consumer loop does, and
// returns each message's error once every done was called, failing when one is called
// twice or not within a minute.
func deliverAll(t *testing.T, b *engine.Batcher, msgs []*message.Message) []error {
	t.Helper()
	errs := make([]error, len(msgs))
	calls := make([]atomic.Int32, len(msgs))
	var wg sync.WaitGroup
	wg.Add(len(msgs))
	for i, m := range msgs {
		b.Deliver(m, "orders", func(err error) {
			if calls[i].Add(1) != 1 {
				t.Errorf("message %d: done called again (err %v)", i, err)
				return
			}
			errs[i] = err
			wg.Done()
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		n := 0
		for i := range calls {
			if calls[i].Load() == 0 {
				n++
			}
		}
		t.Fatalf("%d of %d deliveries got no done within a minute", n, len(msgs))
	}
	return errs
}

// TestBatcherDeliver: Deliver answers every message exactly once, with what HandlerFunc
// would return, on every path. New orders and their copies are processed and counted as
// duplicates in batches; poison goes to the one-at-a-time path and is quarantined (nil: an
// ack); with the breaker open, deliveries wait for it on goroutines of their own and end
// once it closes; a Batcher closed with deliveries queued runs them one at a time. No
// order gets two coupons. While batches run, the deliveries queued hold no goroutine each.
func TestBatcherDeliver(t *testing.T) {
	p := newPipeline(t, pipelineOpts{conns: 16, plugin: true})
	db := p.db.DB
	b, err := p.inbox.NewBatcher(engine.BatchConfig{MaxSize: 64, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	t.Run("batches and copies", func(t *testing.T) {
		const n = 600
		var msgs []*message.Message
		for i := range n {
			msgs = append(msgs, orderMsg(fmt.Sprintf("dl-%04d", i), fmt.Sprintf("u-%d", i)))
		}
		for i := range n / 3 {
			msgs = append(msgs, orderMsg(fmt.Sprintf("dl-%04d", i), fmt.Sprintf("u-%d", i))) // copies, as different messages
		}
		for i, err := range deliverAll(t, b, msgs) {
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		}
		if got := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id LIKE 'dl-%'"); got != n {
			t.Fatalf("%d coupons for %d orders", got, n)
		}
		if got := count(t, db, "SELECT COALESCE(SUM(duplicates), 0) FROM inbox WHERE dedup_key LIKE 'dl-%'"); got != n/3 {
			t.Fatalf("%d duplicates counted, want %d", got, n/3)
		}
		if st := b.Stats(); st.Batches == 0 || st.Batched < n {
			t.Fatalf("stats %+v: want the deliveries in batches", st)
		}
	})

	t.Run("poison", func(t *testing.T) {
		msgs := []*message.Message{
			message.NewMessage(watermill.NewUUID(), []byte(`{"orderId": "broken`)),
			orderMsg("dl-after-poison", "u"),
		}
		for i, err := range deliverAll(t, b, msgs) {
			if err != nil {
				t.Errorf("message %d: %v (poison is quarantined and acked)", i, err)
			}
		}
		if got := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'failed'"); got != 1 {
			t.Fatalf("%d quarantined rows, want the poison's", got)
		}
	})

	t.Run("no goroutine per queued delivery", func(t *testing.T) {
		// Held in the decoders' queue and the collector, a few hundred deliveries would each
		// hold a goroutine under HandlerFunc. Deliver's hold none: the count stays near the
		// Batcher's own.
		lb, err := p.inbox.NewBatcher(engine.BatchConfig{MaxSize: 512, Workers: 1, Linger: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer lb.Close()
		before := runtime.NumGoroutine()
		var done atomic.Int64
		const n = 300
		for i := range n {
			lb.Deliver(orderMsg(fmt.Sprintf("dl-g-%04d", i), "u"), "orders", func(err error) {
				if err != nil {
					t.Error(err)
				}
				done.Add(1)
			})
		}
		extra := runtime.NumGoroutine() - before
		waitFor(t, "the lingering batch", time.Minute, func() (bool, string) {
			return done.Load() == n, fmt.Sprintf("done=%d", done.Load())
		})
		if extra > 20 {
			t.Fatalf("%d more goroutines with %d deliveries queued, want none per delivery", extra, n)
		}
	})

	t.Run("closed with deliveries queued", func(t *testing.T) {
		cb, err := p.inbox.NewBatcher(engine.BatchConfig{MaxSize: 512, Workers: 1, Linger: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var msgs []*message.Message
		for i := range 40 {
			msgs = append(msgs, orderMsg(fmt.Sprintf("dl-c-%04d", i), "u"))
		}
		var errs []error
		var mu sync.Mutex
		var wg sync.WaitGroup
		wg.Add(len(msgs))
		for _, m := range msgs {
			cb.Deliver(m, "orders", func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock(); wg.Done() })
		}
		time.Sleep(100 * time.Millisecond) // queued behind a second's linger
		_ = cb.Close()
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Errorf("after Close: %v", err)
			}
		}
		if got := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id LIKE 'dl-c-%'"); got != len(msgs) {
			t.Fatalf("%d coupons for %d orders", got, len(msgs))
		}
		// Deliver after Close runs the delivery one at a time.
		errs = deliverAll(t, cb, []*message.Message{orderMsg("dl-c-late", "u")})
		if errs[0] != nil {
			t.Fatal(errs[0])
		}
	})

	t.Run("cancelled while queued", func(t *testing.T) {
		cb, err := p.inbox.NewBatcher(engine.BatchConfig{MaxSize: 512, Workers: 1, Linger: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer cb.Close()
		ctx, cancel := context.WithCancel(context.Background())
		m := orderMsg("dl-cancelled", "u")
		m.SetContext(ctx)
		res := make(chan error, 1)
		cb.Deliver(m, "orders", func(err error) { res <- err })
		cancel()
		select {
		case err := <-res:
			if err == nil && count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'dl-cancelled'") != 1 {
				t.Fatal("acked, but no coupon")
			}
		case <-time.After(time.Minute):
			t.Fatal("a cancelled delivery got no done")
		}
	})
}

// TestBatcherDeliverBreaker: with the circuit breaker open, Deliver neither drops nor
// fails a delivery: it waits for the breaker, then the delivery runs.
func TestBatcherDeliverBreaker(t *testing.T) {
	var broken atomic.Bool
	p := newPipeline(t, pipelineOpts{conns: 16, outage: true, wrap: failUntilFixed(&broken),
		inboxCfg: engine.Config{BreakerMinCalls: 5, BreakerOpenFor: 300 * time.Millisecond, MaxAttempts: 100}})
	b, err := p.inbox.NewBatcher(engine.BatchConfig{MaxSize: 16, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	broken.Store(true)
	var msgs []*message.Message
	for i := range 30 {
		msgs = append(msgs, orderMsg(fmt.Sprintf("dl-b-%04d", i), "u"))
	}
	go func() {
		for p.inbox.Breaker().State != engine.BreakerOpen {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		broken.Store(false)
	}()
	for i, err := range deliverAll(t, b, msgs) {
		if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if got := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon WHERE order_id LIKE 'dl-b-%'"); got != len(msgs) {
		t.Fatalf("%d coupons for %d orders", got, len(msgs))
	}
}

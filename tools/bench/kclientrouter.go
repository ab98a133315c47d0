package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/groupcommit"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// The router_wait consumer's stand-in for group commit: batches of routerWaitBatch
// (inbox.batch_size) collected as the Batcher collects them (groupcommit.Collect, its linger
// and inbox.batch_workers), each held routerWaitHold — about what a batch transaction of
// the router takes at its peak — before all its deliveries are released. The window then
// stays full, as at the router's peak: thousands of deliveries waiting for their batch.
const (
	routerWaitBatch   = 512
	routerWaitWorkers = 2
	routerWaitLinger  = 2 * time.Millisecond
	routerWaitHold    = 40 * time.Millisecond
)

// routerWaiter is a delivery of routerConsume waiting for its batch.
type routerWaiter struct{ finish func(error) }

// routerConsume reads n records of topic as the router binary's consumer does, with no
// database: kafkax's ParallelSubscriber (its default window and byte budget) read by
// kafkax.Consume, the binary's consumer loop. The delivery is done at once, or with wait
// once its batch is released (the constants above; its done called on the batch's
// goroutine, as a Batcher's worker calls it). What it costs beyond the client's own consume
// is the consuming path's share of the router's CPU per delivery: the window, the acks and
// a Watermill message per record. Timed to the nth record handled (its offset is committed
// by the next auto-commit, within a second).
func (s *suite) routerConsume(ctx context.Context, topic string, n int, t *kclientTimer, wait bool) error {
	id := kclientGroupID("router", "group")
	defer s.dropGroup(id)
	sub, err := s.kc.NewParallelSubscriber(id, kafkax.ParallelConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer sub.Close()
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	var read atomic.Int64
	done := make(chan struct{})
	handled := func(finish func(error)) {
		switch read.Add(1) {
		case 1:
			t.first()
		case int64(n):
			close(done)
		}
		finish(nil)
	}
	waiting := make(chan *routerWaiter, routerWaitBatch)
	if wait {
		stop := make(chan struct{})
		collected := make(chan struct{})
		go func() {
			defer close(collected)
			cfg := groupcommit.Config{MaxSize: routerWaitBatch, Linger: routerWaitLinger, Workers: routerWaitWorkers}
			// A key per delivery, as the Batcher's (none repeats here).
			key := func(w *routerWaiter) string { return fmt.Sprintf("%p", w) }
			left := groupcommit.Collect(cfg, waiting, stop, key, func(batch []*routerWaiter) {
				time.Sleep(routerWaitHold)
				for _, w := range batch {
					handled(w.finish)
				}
			})
			for _, w := range left {
				w.finish(cctx.Err())
			}
		}()
		defer func() { close(stop); <-collected }()
	}
	deliver := func(msg *message.Message, finish func(error)) {
		if !wait {
			handled(finish)
			return
		}
		select {
		case waiting <- &routerWaiter{finish}:
		case <-cctx.Done():
			finish(cctx.Err())
		}
	}
	ran := make(chan error, 1)
	go func() { ran <- kafkax.Consume(cctx, sub, topic, "kclient", deliver, watermill.NopLogger{}) }()
	select {
	case <-done:
		t.end()
		cancel()
		<-ran
		return nil
	case err := <-ran:
		if err == nil {
			err = fmt.Errorf("the consumer stopped after %d of %d records", read.Load(), n)
		}
		return err
	case <-cctx.Done():
		cancel()
		<-ran
		return fmt.Errorf("%d of %d records read: %w", read.Load(), n, cctx.Err())
	}
}

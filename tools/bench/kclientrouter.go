package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/onceflow/onceflow/internal/groupcommit"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// The router_wait consumer's stand-in for group commit: batches of routerWaitBatch
// (inbox.batch_size) collected as the Batcher collects them (groupcommit.Collect, its linger
// and inbox.batch_workers), each held routerWaitHold — about what a batch transaction of
// the router takes at its peak — before all its deliveries are released. The window then
// stays full, as at the router's peak: thousands of handlers parked, each on its own stack.
const (
	routerWaitBatch   = 512
	routerWaitWorkers = 2
	routerWaitLinger  = 2 * time.Millisecond
	routerWaitHold    = 40 * time.Millisecond
)

// routerConsume reads n records of topic as the router binary's consumer does, with no
// database: kafkax's ParallelSubscriber (its default window and byte budget) feeding
// Watermill's router with the binary's middleware (kafkax.AckOnReturn, Recoverer). The
// handler returns at once, or with wait parks until its batch is released (the constants
// above). What it costs beyond the client's own consume is the consuming path's share of
// the router's CPU per delivery: the window, the acks, a goroutine and a Watermill message
// per record. Timed to the nth record handled (its offset is committed by the next
// auto-commit, within a second).
func (s *suite) routerConsume(ctx context.Context, topic string, n int, t *kclientTimer, wait bool) error {
	id := kclientGroupID("router", "group")
	defer s.dropGroup(id)
	sub, err := s.kc.NewParallelSubscriber(id, kafkax.ParallelConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer sub.Close()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	r.AddMiddleware(kafkax.AckOnReturn, middleware.Recoverer)
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	waiting := make(chan chan struct{}, routerWaitBatch)
	if wait {
		stop := make(chan struct{})
		collected := make(chan struct{})
		go func() {
			defer close(collected)
			cfg := groupcommit.Config{MaxSize: routerWaitBatch, Linger: routerWaitLinger, Workers: routerWaitWorkers}
			// A key per delivery, as the Batcher's (none repeats here).
			key := func(w chan struct{}) string { return fmt.Sprintf("%p", w) }
			left := groupcommit.Collect(cfg, waiting, stop, key, func(batch []chan struct{}) {
				time.Sleep(routerWaitHold)
				for _, w := range batch {
					w <- struct{}{}
				}
			})
			for _, w := range left {
				w <- struct{}{}
			}
		}()
		defer func() { close(stop); <-collected }()
	}
	var read atomic.Int64
	done := make(chan struct{})
	r.AddConsumerHandler("kclient", topic, sub, func(*message.Message) error {
		if wait {
			w := make(chan struct{}, 1)
			select {
			case waiting <- w:
			case <-cctx.Done():
				return cctx.Err()
			}
			select {
			case <-w:
			case <-cctx.Done():
				return cctx.Err()
			}
		}
		switch read.Add(1) {
		case 1:
			t.first()
		case int64(n):
			close(done)
		}
		return nil
	})
	ran := make(chan error, 1)
	go func() { ran <- r.Run(cctx) }()
	select {
	case <-done:
		t.end()
		cancel()
		<-ran
		return nil
	case err := <-ran:
		if err == nil {
			err = fmt.Errorf("the router stopped after %d of %d records", read.Load(), n)
		}
		return err
	case <-cctx.Done():
		cancel()
		<-ran
		return fmt.Errorf("%d of %d records read: %w", read.Load(), n, cctx.Err())
	}
}

package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// routerConsume reads n records of topic as the router binary's consumer does, with no
// database: kafkax's ParallelSubscriber (its default window and byte budget) feeding
// Watermill's router with the binary's middleware (kafkax.AckOnReturn, Recoverer). The
// handler returns at once, or with wait as a Batcher's deliveries do: each waits until a
// batch of 512 (inbox.batch_size) or the 2 ms linger releases it, all of a batch at once.
// What it costs beyond the client's own consume is the consuming path's share of the
// router's CPU per delivery: the window, the acks, a goroutine and a Watermill message per
// record.
func (s *suite) routerConsume(ctx context.Context, topic string, n int, t *kclientTimer, wait bool) error {
	id := kclientGroupID("router", "group")
	defer s.dropGroup(id)
	sub, err := s.kc.NewParallelSubscriber(id, kafkax.ParallelConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	r.AddMiddleware(kafkax.AckOnReturn, middleware.Recoverer)
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	waiting := make(chan chan struct{}, 4096)
	if wait {
		go releaseInBatches(cctx, waiting, 512, 2*time.Millisecond)
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
	case <-cctx.Done():
		return fmt.Errorf("%d of %d records read: %w", read.Load(), n, cctx.Err())
	}
	cancel()
	<-ran
	return nil
}

// releaseInBatches collects the waiters sent on in and releases them size at a time, or
// what has come once linger passes, until ctx ends.
func releaseInBatches(ctx context.Context, in <-chan chan struct{}, size int, linger time.Duration) {
	tick := time.NewTicker(linger)
	defer tick.Stop()
	batch := make([]chan struct{}, 0, size)
	release := func() {
		for _, w := range batch {
			w <- struct{}{}
		}
		batch = batch[:0]
	}
	for {
		select {
		case w := <-in:
			if batch = append(batch, w); len(batch) == size {
				release()
			}
		case <-tick.C:
			release()
		case <-ctx.Done():
			return
		}
	}
}

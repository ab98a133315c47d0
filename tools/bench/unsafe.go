package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/groupcommit"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// unsafeBatcher is the group-commit delivery path without the inbox, the baseline its
// overhead is measured against: the same concurrent senders and messages, the same decode,
// deliveries collected exactly like the Batcher's (groupcommit.Collect: MaxSize, linger,
// Workers batches at once, no key in two running batches), and the same multi-row
// HandleBatch in one transaction per batch — but no inbox claim, no read-back and no dedup
// record. Bench-only: nothing stops a redelivery here but the grant table's own key.
type unsafeBatcher struct {
	db    *sql.DB
	h     inbox.BatchHandler
	queue chan *unsafeReq
	stop  chan struct{}
	done  chan struct{}
}

type unsafeReq struct {
	d    *inbox.Delivery
	done chan error
}

func newUnsafeBatcher(db *sql.DB, h inbox.BatchHandler, size, workers int, linger time.Duration) *unsafeBatcher {
	u := &unsafeBatcher{db: db, h: h, queue: make(chan *unsafeReq, size), stop: make(chan struct{}), done: make(chan struct{})}
	// linger as the Batcher's: its default when 0
	if linger == 0 {
		linger = 2 * time.Millisecond
	}
	cfg := groupcommit.Config{MaxSize: size, Linger: linger, Workers: workers}
	go func() {
		defer close(u.done)
		left := groupcommit.Collect(cfg, u.queue, u.stop, func(r *unsafeReq) string { return r.d.Key }, func(batch []*unsafeReq) {
			err := u.run(batch)
			for _, r := range batch {
				r.done <- err
			}
		})
		for _, r := range left {
			r.done <- errors.New("unsafe batcher closed")
		}
	}()
	return u
}

func (u *unsafeBatcher) close() {
	close(u.stop)
	<-u.done
}

func (u *unsafeBatcher) process(msg *message.Message) error {
	o, err := coupon.DecodeOrderPaid(msg.Payload)
	if err != nil {
		return err
	}
	r := &unsafeReq{d: &inbox.Delivery{Message: msg, BizType: coupon.BizType, Key: o.OrderID, Value: o, Attempt: 1}, done: make(chan error, 1)}
	u.queue <- r
	return <-r.done
}

func (u *unsafeBatcher) run(batch []*unsafeReq) error {
	sort.Slice(batch, func(i, j int) bool { return batch[i].d.Key < batch[j].d.Key })
	ds := make([]*inbox.Delivery, len(batch))
	for i, r := range batch {
		ds[i] = r.d
	}
	return grantBatch(context.Background(), u.db, u.h, ds)
}

// grantBatch runs the batched grant of ds in one transaction without the inbox, retried
// whole after a deadlock; every grant must finish in it (the bench's service answers at
// once: HandleBatch makes the calls itself).
func grantBatch(ctx context.Context, db *sql.DB, h inbox.BatchHandler, ds []*inbox.Delivery) error {
	for {
		err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
			progs, err := h.HandleBatch(ctx, tx, ds)
			if err != nil {
				return err
			}
			for _, p := range progs {
				if p != inbox.Done {
					return fmt.Errorf("batch left a grant unfinished")
				}
			}
			return nil
		})
		if err != nil && dbx.IsLockConflict(err) {
			continue
		}
		return err
	}
}

// benchUnsafeSamePath: the baseline of the group-commit overhead — every order through
// unsafeBatcher, offered exactly as benchInboxBatch offers them to the Batcher.
// It returns orders/s and the CPU µs per order of all processes.
func (s *suite) benchUnsafeSamePath(ctx context.Context) (rate, cpuPerOrder float64, err error) {
	if err := s.truncate(ctx); err != nil {
		return 0, 0, err
	}
	h, _, closeH, err := s.coupon(ctx, "", false)
	if err != nil {
		return 0, 0, err
	}
	defer closeH()
	u := newUnsafeBatcher(s.db, h.(inbox.BatchHandler), s.cfg.batchSize, s.cfg.batchLanes, s.cfg.batchLinger)
	defer u.close()
	n := s.cfg.batchOrders
	defer s.withWorkers(s.cfg.batchSenders)()
	cpu := newCPUMeter(s.services)
	el, err := s.parallel(n, func(i int) error {
		return u.process(message.NewMessage(watermill.NewUUID(), order("unsafe-path", i).Encode()))
	})
	if err != nil {
		return 0, 0, err
	}
	rate = float64(n) / el.Seconds()
	kv := cpu.perOrder(n)
	s.report("unsafe", append([]any{"mode", "batch", "batch_size", s.cfg.batchSize, "orders_per_s", rate, "orders", n, "seconds", el.Seconds()}, kv...)...)
	return rate, cpuMap(kv)["total_cpu_us_per_order"], nil
}

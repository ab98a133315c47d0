package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// singleGroup measures one delivery per transaction (Inbox.Process) against its baseline,
// the handler's steps alone, then the naive SELECT-then-INSERT. steps_per_tx=1 is the
// default (each state transition commits on its own); 3 runs the whole grant in one
// transaction (inbox.steps_per_transaction), same guarantees.
func (s *suite) singleGroup(ctx context.Context) error {
	for _, spt := range []int{1, 3} {
		unsafeRate, err := s.benchUnsafe(ctx, spt)
		if err != nil {
			return fmt.Errorf("unsafe: %w", err)
		}
		if err := s.benchInbox(ctx, spt, unsafeRate); err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
	}
	if err := s.benchNaive(ctx); err != nil {
		return fmt.Errorf("naive: %w", err)
	}
	return nil
}

// benchUnsafe: the same handler steps without the inbox (the overhead baseline). Each
// delivery, duplicates included, runs the steps; the state machine keeps it correct, but
// nothing records the delivery. It returns orders/s.
func (s *suite) benchUnsafe(ctx context.Context, spt int) (float64, error) {
	if err := s.truncate(ctx); err != nil {
		return 0, err
	}
	g, _, err := s.granter(ctx, "")
	if err != nil {
		return 0, err
	}
	n, db := s.cfg.orders, s.db
	el, err := s.parallel(n, func(i int) error {
		o := order("unsafe", i)
		for {
			var prog inbox.Progress
			err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
				var err error
				for range spt {
					if prog, err = g.Step(ctx, tx, o); err != nil || prog == inbox.Done {
						return err
					}
				}
				return nil
			})
			if err != nil {
				if dbx.IsLockConflict(err) {
					continue
				}
				return err
			}
			if prog == inbox.Done {
				return nil
			}
		}
	})
	if err != nil {
		return 0, err
	}
	s.report("unsafe", "steps_per_tx", spt, "orders_per_s", float64(n)/el.Seconds(), "orders", n, "seconds", el.Seconds())
	return float64(n) / el.Seconds(), nil
}

// benchInbox: every order through the inbox, plus 30 % duplicate deliveries; its overhead
// against unsafeRate, the orders/s of benchUnsafe with the same steps per transaction.
func (s *suite) benchInbox(ctx context.Context, spt int, unsafeRate float64) error {
	if err := s.truncate(ctx); err != nil {
		return err
	}
	g, _, err := s.granter(ctx, "")
	if err != nil {
		return err
	}
	n := s.cfg.orders
	ib, err := engine.New(s.db, g, engine.Config{BizType: coupon.BizType, StepsPerTx: spt}, nil, nil)
	if err != nil {
		return err
	}
	el, err := s.parallel(n, func(i int) error {
		o := order("inbox", i)
		_, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"}, engine.ProcessOptions{})
		return err
	})
	if err != nil {
		return err
	}
	rate := float64(n) / el.Seconds()
	dups := n * 3 / 10
	del, err := s.parallel(dups, func(i int) error {
		o := order("inbox", i*3)
		_, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"}, engine.ProcessOptions{})
		return err
	})
	if err != nil {
		return err
	}
	overhead := 0.0
	if unsafeRate > 0 {
		overhead = (unsafeRate - rate) / unsafeRate * 100
	}
	s.report("inbox", "steps_per_tx", spt, "orders_per_s", rate, "overhead_pct_vs_unsafe", overhead, "duplicates_per_s", float64(dups)/del.Seconds())
	return nil
}

// benchNaive: SELECT-then-INSERT under duplicate deliveries (each order delivered twice at once).
func (s *suite) benchNaive(ctx context.Context) error {
	n, db := s.cfg.orders, s.db
	start := time.Now()
	var dups atomic.Int64
	seen := sync.Map{}
	_, err := s.parallel(n*2, func(i int) error {
		id := fmt.Sprintf("naive-%07d", i/2)
		var c int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM user_coupon WHERE order_id = ? AND campaign_id = 'naive'", id).Scan(&c); err != nil {
			return err
		}
		if c > 0 {
			return nil
		}
		// The naive table has no unique key in the incident; here the unique key catches
		// what the SELECT let through, and we count it as the duplicate it would have been.
		_, err := db.ExecContext(ctx, "INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES (?, ?, 'naive', 'u', 500)",
			watermill.NewUUID(), id)
		if dbx.IsDuplicate(err) {
			dups.Add(1)
			return nil
		}
		if err == nil {
			if _, loaded := seen.LoadOrStore(id, true); loaded {
				dups.Add(1)
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	el := time.Since(start)
	s.report("naive", "orders_per_s", float64(n)/el.Seconds(), "duplicates", dups.Load(), "deliveries", n*2)
	return nil
}

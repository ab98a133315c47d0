package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

// stormGroup: every order delivered many times at once (a replay storm): exactly one
// coupon each, and how long the inbox takes to absorb it.
func (s *suite) stormGroup(ctx context.Context) error {
	if err := s.benchStorm(ctx); err != nil {
		return fmt.Errorf("storm: %w", err)
	}
	return nil
}

func (s *suite) benchStorm(ctx context.Context) error {
	if err := s.truncate(ctx); err != nil {
		return err
	}
	// Through the router's default path (group commit), offered by many concurrent senders.
	b, _, closeBatcher, err := s.newBatcher(ctx, false)
	if err != nil {
		return err
	}
	defer closeBatcher()
	defer s.withWorkers(s.cfg.batchSenders)()
	orders, each := s.cfg.stormN, s.cfg.stormK
	total := orders * each
	el, err := s.parallel(total, func(i int) error {
		o := order("storm", i/each) // each order's deliveries arrive back to back
		_, err := b.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"})
		return err
	})
	if err != nil {
		return err
	}
	var coupons, dups, blocked int
	if err := s.db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM user_coupon WHERE order_id LIKE 'storm-%'), (SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM user_coupon WHERE order_id LIKE 'storm-%'), (SELECT COALESCE(SUM(duplicates), 0) FROM inbox)").Scan(&coupons, &dups, &blocked); err != nil {
		return err
	}
	s.report("storm", "orders", orders, "deliveries_each", each, "seconds", el.Seconds(), "coupons", coupons, "duplicate_coupons", dups,
		"duplicates_blocked", blocked, "deliveries_per_s", float64(total)/el.Seconds())
	return nil
}

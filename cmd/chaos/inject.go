package main

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"github.com/IBM/sarama"
)

// Faults the harness can inject after a run (mutating what the run left behind), to show
// that the checker fails when an invariant is broken. Each maps to the violation kind the
// checker must report.
var injectKinds = map[string]string{
	"dup-coupon":         "duplicate-coupon",   // a second coupon for a granted order (the unique key dropped, as with the seed's SELECT-then-INSERT)
	"lost-order":         "lost",               // the seed's bug: the inbox says done, the grant and its coupon never happened
	"illegal-transition": "illegal-transition", // GRANTED → LOCKED in the transition log
	"dup-event":          "duplicate-event",    // the order's CouponGranted published a second time (same event_id) on Kafka
}

func parseInject(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k == "all" {
			out = append(out, "dup-coupon", "lost-order", "illegal-transition", "dup-event")
			continue
		}
		if _, ok := injectKinds[k]; !ok {
			return nil, fmt.Errorf("-inject: unknown fault %q (use dup-coupon, lost-order, illegal-transition, dup-event or all)", k)
		}
		out = append(out, k)
	}
	return out, nil
}

// inject applies kinds to the database (admin pool: dropping the unique key needs DDL) and,
// for dup-event, to Kafka. Each fault hits a different GRANTED order of the prefix.
func inject(ctx context.Context, admin *sql.DB, prefix string, kinds []string, brokers []string, grantedTopic string) ([]string, error) {
	var granted []string
	if err := query(ctx, admin, `SELECT order_id FROM coupon_grant WHERE order_id LIKE ? AND state = 'GRANTED' ORDER BY order_id LIMIT 16`,
		[]any{likePrefix(prefix)}, func(s scanner) error {
			var id string
			err := s.Scan(&id)
			granted = append(granted, id)
			return err
		}); err != nil {
		return nil, err
	}
	sort.Strings(granted)
	if len(granted) < len(kinds) {
		return nil, fmt.Errorf("inject: %d GRANTED orders with prefix %s, need %d", len(granted), prefix, len(kinds))
	}
	var done []string
	for i, k := range kinds {
		id := granted[i]
		var stmts []string
		switch k {
		case "dup-coupon":
			var has int
			if err := admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'user_coupon' AND index_name = 'uk_order_campaign'`).Scan(&has); err != nil {
				return done, fmt.Errorf("inject %s: %w", k, err)
			}
			if has > 0 {
				stmts = append(stmts, `ALTER TABLE user_coupon DROP INDEX uk_order_campaign`)
			}
			stmts = append(stmts, `INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents)
 SELECT UUID(), order_id, campaign_id, user_id, value_cents FROM user_coupon WHERE order_id = ?`)
		case "lost-order":
			stmts = []string{`DELETE FROM user_coupon WHERE order_id = ?`, `DELETE FROM coupon_grant_log WHERE order_id = ?`,
				`DELETE FROM outbox WHERE msg_key = ?`, `DELETE FROM coupon_grant WHERE order_id = ?`}
		case "illegal-transition":
			stmts = []string{`INSERT INTO coupon_grant_log (order_id, campaign_id, from_state, to_state)
 SELECT order_id, campaign_id, 'GRANTED', 'LOCKED' FROM coupon_grant WHERE order_id = ?`}
		case "dup-event":
			if err := republish(ctx, admin, id, brokers, grantedTopic); err != nil {
				return done, fmt.Errorf("inject %s: %w", k, err)
			}
		}
		for _, q := range stmts {
			var err error
			if strings.Contains(q, "?") {
				_, err = admin.ExecContext(ctx, q, id)
			} else {
				_, err = admin.ExecContext(ctx, q)
			}
			if err != nil {
				return done, fmt.Errorf("inject %s: %s: %w", k, firstWords(q), err)
			}
		}
		done = append(done, fmt.Sprintf("%s on order %s", k, id))
	}
	return done, nil
}

// republish sends the order's CouponGranted event again, as a non-transactional message with
// the same key, headers and payload (what an at-least-once relay does after a crash).
func republish(ctx context.Context, db *sql.DB, orderID string, brokers []string, topic string) error {
	var eventID string
	var payload []byte
	if err := db.QueryRowContext(ctx, `SELECT event_id, payload FROM outbox WHERE msg_key = ? AND event_type = 'CouponGranted'`, orderID).Scan(&eventID, &payload); err != nil {
		return err
	}
	sc := saramaConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		return err
	}
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(orderID), Value: sarama.ByteEncoder(payload),
		Headers: []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte(eventID)}, {Key: []byte("event_type"), Value: []byte("CouponGranted")}}})
	return err
}

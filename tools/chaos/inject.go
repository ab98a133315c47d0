package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Faults the harness can inject after a run (mutating what the run left behind), to show
// that the checker fails when an invariant is broken. Each maps to the violation kind the
// checker must report.
var injectKinds = map[string]string{
	"dup-coupon":         "duplicate-coupon",   // a second coupon for a granted order (the unique key dropped, as with the seed's SELECT-then-INSERT)
	"lost-order":         "lost",               // the seed's bug: the inbox says done, the grant and its coupon never happened
	"illegal-transition": "illegal-transition", // GRANTED → LOCKED in the transition log
	"dup-event":          "duplicate-event",    // the order's CouponGranted published a second time (same event_id) on Kafka
	"misbehaver-flip":    "misbehaver-outcome", // one misbehaving-plugin row flipped: a quarantined one to done (or, if none, a done one to failed/panic)
	"lag":                "committed-lag",      // an order-paid record produced after the run, which no consumer group of the run has read
	"poison-drop":        "poison-lost",        // the coupon plugin's quarantine row of one poison record deleted (the tombstone's, if there is one)
}

// allInject is what `-inject all` injects.
var allInject = []string{"dup-coupon", "lost-order", "illegal-transition", "dup-event", "misbehaver-flip", "lag", "poison-drop"}

// injectTarget is where the faults go besides the database.
type injectTarget struct {
	Brokers      []string
	GrantedTopic string // dup-event republishes there
	OrderTopic   string // lag produces there
	Misbehaver   string // biz type of the misbehaving plugin's inbox rows (misbehaver-flip)
}

func parseInject(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k == "all" {
			out = append(out, allInject...)
			continue
		}
		if _, ok := injectKinds[k]; !ok {
			return nil, fmt.Errorf("-inject: unknown fault %q (use %s or all)", k, strings.Join(allInject, ", "))
		}
		out = append(out, k)
	}
	return out, nil
}

// inject applies kinds to the database (admin pool: dropping the unique key needs DDL) and,
// for dup-event and lag, to Kafka. Each fault of the coupon plugin's state hits a different
// GRANTED order of the prefix.
func inject(ctx context.Context, admin *sql.DB, prefix string, kinds []string, t injectTarget) ([]string, error) {
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
			drop, err := dropOrderCampaignKey(ctx, admin)
			if err != nil {
				return done, fmt.Errorf("inject %s: %w", k, err)
			}
			uuid := "UUID()"
			if dbx.DialectOf(admin).IsPostgres() {
				uuid = "gen_random_uuid()"
			}
			stmts = append(drop, `INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents)
 SELECT `+uuid+`, order_id, campaign_id, user_id, value_cents FROM user_coupon WHERE order_id = ?`)
		case "lost-order":
			stmts = []string{`DELETE FROM user_coupon WHERE order_id = ?`, `DELETE FROM coupon_grant_log WHERE order_id = ?`,
				`DELETE FROM outbox WHERE msg_key = ?`, `DELETE FROM coupon_grant WHERE order_id = ?`}
		case "illegal-transition":
			stmts = []string{`INSERT INTO coupon_grant_log (order_id, campaign_id, from_state, to_state)
 SELECT order_id, campaign_id, 'GRANTED', 'LOCKED' FROM coupon_grant WHERE order_id = ?`}
		case "dup-event":
			if err := republish(ctx, admin, id, t.Brokers, t.GrantedTopic); err != nil {
				return done, fmt.Errorf("inject %s: %w", k, err)
			}
		case "misbehaver-flip":
			what, err := flipMisbehaver(ctx, admin, prefix, t.Misbehaver)
			if err != nil {
				return done, fmt.Errorf("inject %s: %w", k, err)
			}
			done = append(done, k+": "+what)
			continue
		case "poison-drop":
			var key string
			err := admin.QueryRowContext(ctx, rebind(admin, `SELECT dedup_key FROM inbox WHERE biz_type = 'coupon' AND reason = 'poison' AND topic = ?
 ORDER BY tombstone DESC, id LIMIT 1`), t.OrderTopic).Scan(&key)
			if err == nil {
				_, err = admin.ExecContext(ctx, rebind(admin, `DELETE FROM inbox WHERE biz_type = 'coupon' AND dedup_key = ?`), key)
			}
			if err != nil {
				return done, fmt.Errorf("inject %s: %w", k, err)
			}
			done = append(done, fmt.Sprintf("%s: quarantine row %s (biz type coupon) deleted", k, key))
			continue
		case "lag":
			if t.OrderTopic == "" {
				return done, fmt.Errorf("inject %s: no order topic", k)
			}
			at, err := produceUnread(t.Brokers, t.OrderTopic, prefix+"-inject-lag")
			if err != nil {
				return done, fmt.Errorf("inject %s: %w", k, err)
			}
			done = append(done, fmt.Sprintf("%s: one record at %s that no router read", k, at))
			continue
		}
		for _, q := range stmts {
			var err error
			if strings.Contains(q, "?") {
				_, err = admin.ExecContext(ctx, rebind(admin, q), id)
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

// dropOrderCampaignKey is the DDL that drops user_coupon's unique key on (order_id,
// campaign_id), if it is there: MariaDB's uk_order_campaign; on PostgreSQL whatever unique
// constraint or index covers exactly those columns.
func dropOrderCampaignKey(ctx context.Context, admin *sql.DB) ([]string, error) {
	if !dbx.DialectOf(admin).IsPostgres() {
		var has int
		if err := admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'user_coupon' AND index_name = 'uk_order_campaign'`).Scan(&has); err != nil {
			return nil, err
		}
		if has == 0 {
			return nil, nil
		}
		return []string{`ALTER TABLE user_coupon DROP INDEX uk_order_campaign`}, nil
	}
	var stmts []string
	err := query(ctx, admin, `SELECT i.relname, COALESCE(c.conname, '') FROM pg_index x
 JOIN pg_class i ON i.oid = x.indexrelid
 LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.conrelid = x.indrelid
 WHERE x.indrelid = 'user_coupon'::regclass AND x.indisunique
 AND pg_get_indexdef(x.indexrelid) LIKE '%(order_id, campaign_id)'`, nil, func(s scanner) error {
		var index, constraint string
		if err := s.Scan(&index, &constraint); err != nil {
			return err
		}
		if constraint != "" {
			stmts = append(stmts, `ALTER TABLE user_coupon DROP CONSTRAINT `+dbx.Postgres.Quote(constraint))
		} else {
			stmts = append(stmts, `DROP INDEX `+dbx.Postgres.Quote(index))
		}
		return nil
	})
	return stmts, err
}

// republish sends the order's CouponGranted event again, as a non-transactional message with
// the same key, headers and payload (what an at-least-once relay does after a crash).
func republish(ctx context.Context, db *sql.DB, orderID string, brokers []string, topic string) error {
	var eventID string
	var payload []byte
	if err := db.QueryRowContext(ctx, rebind(db, `SELECT event_id, payload FROM outbox WHERE msg_key = ? AND event_type = 'CouponGranted'`), orderID).Scan(&eventID, &payload); err != nil {
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

// flipMisbehaver flips one inbox row of the misbehaving plugin: a quarantined one (the
// first by key) to done, or, when there is none, a done one to failed with reason panic.
func flipMisbehaver(ctx context.Context, admin *sql.DB, prefix, bizType string) (string, error) {
	if bizType == "" {
		return "", fmt.Errorf("no misbehaving plugin in this run")
	}
	for _, f := range []struct{ from, set, to string }{
		{"failed", "status = 'done', reason = NULL", "done"},
		{"done", "status = 'failed', reason = 'panic'", "failed/panic"},
	} {
		var id int64
		var key string
		err := admin.QueryRowContext(ctx, rebind(admin, `SELECT id, dedup_key FROM inbox WHERE biz_type = ? AND dedup_key LIKE ? AND status = ? ORDER BY dedup_key LIMIT 1`),
			bizType, likePrefix(prefix), f.from).Scan(&id, &key)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return "", err
		}
		if _, err := admin.ExecContext(ctx, rebind(admin, `UPDATE inbox SET `+f.set+` WHERE id = ?`), id); err != nil {
			return "", err
		}
		return fmt.Sprintf("biz type %s order %s %s → %s", bizType, key, f.from, f.to), nil
	}
	return "", fmt.Errorf("no inbox row of biz type %s with prefix %s", bizType, prefix)
}

// produceUnread sends one order-paid record under key (of the run's prefix, so it is
// neither an order of a ledger nor poison) after the routers stopped: the run's consumer
// groups are then one record behind on its partition.
func produceUnread(brokers []string, topic, key string) (string, error) {
	sc := saramaConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		return "", err
	}
	defer p.Close()
	v := fmt.Sprintf(`{"orderId":%q,"userId":"u-inject","amountCents":100}`, key)
	part, off, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(v)})
	return fmt.Sprintf("%s/%d/%d", topic, part, off), err
}

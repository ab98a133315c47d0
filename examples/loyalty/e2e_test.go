package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/inbox/inboxtest"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

// The team's router end to end on the real MariaDB and Kafka, through its own command line
// (this module's main: onceflow's CLI with the loyalty plugin only): `migrate` creates the
// plugin's tables in their own version table, `run` consumes order-shipped with duplicate
// deliveries and poison (a quarter of the orders with ids as long as the plugin allows, 64
// bytes), and every order is credited once, with exactly one PointsCredited event on
// points-credited for a read_committed consumer; the poison is quarantined, and the group's
// committed offsets reach the end of every partition.
func TestLoyaltyRouterEndToEnd(t *testing.T) {
	kc := inboxtest.Kafka(t)
	in := inboxtest.NewTopic(t, kc, "order-shipped", 6)
	out := inboxtest.NewTopic(t, kc, "points-credited", 3)
	d := inboxtest.DB(t, 4) // the framework's tables only: the plugin's come from `migrate`

	group := "g-" + in
	cfg := filepath.Join(t.TempDir(), "loyalty.yaml")
	writeFile(t, cfg, fmt.Sprintf(`db:
  dsn: %q
  admin_dsn: %q
kafka:
  brokers: [%q]
  session_timeout: 6s
  rebalance_timeout: 6s
  heartbeat: 1s
relay:
  transactional_id: loyalty-e2e-%s
admin:
  listen: ""
log:
  level: warn
plugins:
  loyalty-points:
    topics: [%q]
    consumer_group: %q
    credited_topic: %q
`, d.DSN, d.AdminDSN, strings.Join(kc.Brokers, ","), in, in, group, out))

	ctx := context.Background()
	if err := routercmd.Run(ctx, []string{"--config", cfg, "migrate"}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	var versions int
	if err := d.DB.QueryRow("SELECT COUNT(*) FROM goose_db_version_loyalty_points WHERE version_id > 0").Scan(&versions); err != nil || versions != 1 {
		t.Fatalf("the plugin's version table: %d versions, %v", versions, err)
	}

	const orders = 400
	var msgs []*sarama.ProducerMessage
	msg := func(key string, value []byte) *sarama.ProducerMessage {
		m := &sarama.ProducerMessage{Topic: in, Key: sarama.StringEncoder(key),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}}
		if value != nil {
			m.Value = sarama.ByteEncoder(value)
		}
		return m
	}
	order := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"orderId": %q, "userId": "u-%d", "points": %d}`, orderID(i), i%50, 10+i%7))
	}
	for i := range orders {
		id := orderID(i)
		msgs = append(msgs, msg(id, order(i)))
		if i%3 == 0 { // a third delivered twice: a different message, the same meaning
			msgs = append(msgs, msg(id, order(i)))
		}
		if i%100 == 50 {
			msgs = append(msgs, msg("poison", []byte(`{"orderId": "ord-`)), msg("tomb", nil))
		}
	}
	poison := 2 * orders / 100
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
	p.Close()

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- routercmd.Run(rctx, []string{"--config", cfg, "run"}) }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var credits, quarantined, pending int
		err := d.DB.QueryRow(`SELECT (SELECT COUNT(*) FROM points_credit), (SELECT COUNT(*) FROM inbox WHERE status = 'failed'),
 (SELECT COUNT(*) FROM outbox WHERE published_at IS NULL)`).Scan(&credits, &quarantined, &pending)
		if err != nil {
			t.Fatal(err)
		}
		lag := inboxtest.CommittedLag(t, kc, group, in)
		behind := int64(0)
		for _, l := range lag {
			behind += l
		}
		if credits == orders && quarantined == poison && pending == 0 && behind == 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("router stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2m: credits=%d/%d quarantined=%d/%d unpublished=%d committed lag=%v", credits, orders, quarantined, poison, pending, lag)
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("router: %v", err)
	}
	var dupCredits int
	if err := d.DB.QueryRow("SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM points_credit").Scan(&dupCredits); err != nil || dupCredits != 0 {
		t.Fatalf("%d duplicate credits (%v)", dupCredits, err)
	}
	recs := inboxtest.ReadTopic(t, kc, out)
	if bad := oneEventPerOrder(recs, orders); len(bad) > 0 {
		t.Fatalf("points-credited: %v", bad[:min(5, len(bad))])
	}
	// The check can fail: an event read twice is caught.
	if bad := oneEventPerOrder(append(recs, recs[len(recs)/2]), orders); len(bad) == 0 {
		t.Fatal("an injected duplicate event went unnoticed")
	}
}

// oneEventPerOrder lists what is wrong with the events read back: every order exactly one
// event, no event id twice.
func oneEventPerOrder(recs []kafkax.Record, orders int) []string {
	perOrder, ids := map[string]int{}, map[string]int{}
	for _, r := range recs {
		perOrder[r.Key]++
		ids[r.Headers["event_id"]]++
	}
	var bad []string
	for i := range orders {
		if id := orderID(i); perOrder[id] != 1 {
			bad = append(bad, fmt.Sprintf("order %s: %d events", id, perOrder[id]))
		}
	}
	for id, n := range ids {
		if n != 1 {
			bad = append(bad, fmt.Sprintf("event %s read %d times", id, n))
		}
	}
	if len(recs) != orders {
		bad = append(bad, fmt.Sprintf("%d events for %d orders", len(recs), orders))
	}
	return bad
}

// orderID is order i's id: every fourth one 64 bytes long, the longest the plugin takes.
func orderID(i int) string {
	id := fmt.Sprintf("ord-%04d", i)
	if i%4 == 0 {
		id += "-" + strings.Repeat("x", 64-len(id)-1)
	}
	return id
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// startBatchRouter runs the router's default path. The parallel subscriber, with many
// messages per partition in flight in per-key order, feeds a Batcher for group commit.
func startBatchRouter(t *testing.T, kc kafkax.Config, group, topic string, ib *engine.Inbox, received *atomic.Int64) (stop func(), b *engine.Batcher) {
	t.Helper()
	sub, err := kc.NewParallelSubscriber(group, kafkax.ParallelConfig{Window: 256}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	b, err = ib.NewBatcher(engine.BatchConfig{MaxSize: 64, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	h := b.HandlerFunc(topic)
	stop = runRouter(t, sub, topic, func(m *message.Message) error {
		received.Add(1)
		return h(m)
	}, func() { _ = b.Close() })
	return stop, b
}

// eventsPerOrder checks the granted topic as read back. Each order has exactly one record
// and one event id, and no event id comes twice.
func eventsPerOrder(recs []kafkax.Record, orders int, orderID func(int) string) []string {
	perOrder := map[string]int{}
	ids := map[string]int{}
	for _, r := range recs {
		perOrder[r.Key]++
		ids[r.Headers[outbox.HeaderEventID]]++
	}
	var bad []string
	for i := range orders {
		if n := perOrder[orderID(i)]; n != 1 {
			bad = append(bad, fmt.Sprintf("order %s: %d events", orderID(i), n))
		}
	}
	for id, n := range ids {
		if n != 1 {
			bad = append(bad, fmt.Sprintf("event id %s published %d times", id, n))
		}
	}
	if len(recs) != orders {
		bad = append(bad, fmt.Sprintf("%d records for %d orders", len(recs), orders))
	}
	return bad
}

// TestKafkaGroupCommitEndToEnd runs the router's default path end to end on the real
// broker. 3,000 orders, each sent twice as different messages, and poison are consumed
// through the parallel subscriber and group commit. A second router joins mid-run and the
// first leaves, so partitions move with messages in flight. The exactly-once relay
// publishes. Every order gets one coupon and exactly one CouponGranted record. The check
// that says so catches an injected duplicate.
func TestKafkaGroupCommitEndToEnd(t *testing.T) {
	kc := testenv.Kafka(t)
	kc.SessionTimeout = 6 * time.Second
	kc.RebalanceTimeout = 6 * time.Second
	kc.HeartbeatEvery = time.Second
	in := testenv.Topic(t, kc, "order-paid", 6)
	granted := testenv.Topic(t, kc, "coupon-granted", 3)
	a := newPipeline(t, pipelineOpts{conns: 32, grantedTopic: granted})
	b := newPipeline(t, pipelineOpts{shared: &a.db, grantedTopic: granted})
	db := a.db.DB

	relay, err := outbox.NewExactlyOnceRelay(db, kc, outbox.RelayConfig{PollInterval: 20 * time.Millisecond,
		TransactionalID: "test-" + in, PositionsTopic: testenv.Topic(t, kc, "relay-positions", 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(rctx) }()
	t.Cleanup(func() { rcancel(); <-relayDone; _ = relay.Close() })

	const orders = 3000
	id := func(i int) string { return fmt.Sprintf("gc-%05d", i) }
	var msgs [][2]string
	for i := range orders {
		msgs = append(msgs, [2]string{id(i), orderJSON(id(i), "u")})
		if i%50 == 0 {
			msgs = append(msgs, [2]string{"x", `{"orderId": "broken`})
		}
	}
	for i := range orders {
		msgs = append(msgs, [2]string{id(i), orderJSON(id(i), "u")}) // the duplicates
	}
	produce(t, kc, in, msgs...)
	poison := (orders + 49) / 50

	group := "g-" + in
	var recvA, recvB atomic.Int64
	stopA, batcherA := startBatchRouter(t, kc, group, in, a.inbox, &recvA)
	waitFor(t, "router A to grant a third", 120*time.Second, func() (bool, string) {
		n := count(t, db, "SELECT COUNT(*) FROM user_coupon")
		return n >= orders/3, fmt.Sprintf("coupons=%d", n)
	})
	_, batcherB := startBatchRouter(t, kc, group, in, b.inbox, &recvB)
	waitFor(t, "two thirds", 120*time.Second, func() (bool, string) {
		n := count(t, db, "SELECT COUNT(*) FROM user_coupon")
		return n >= 2*orders/3, fmt.Sprintf("coupons=%d", n)
	})
	stopA()
	// Every delivery beyond the first of an order is counted as a duplicate. That is at
	// least the 3,000 duplicate messages, plus whatever the moves redelivered.
	waitFor(t, "every order granted, every duplicate counted, the poison quarantined, the outbox drained", 180*time.Second, func() (bool, string) {
		c := count(t, db, "SELECT COUNT(*) FROM user_coupon")
		q := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason = 'poison'")
		pend := count(t, db, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL")
		d := count(t, db, "SELECT COALESCE(SUM(duplicates), 0) FROM inbox WHERE status = 'done'")
		return c == orders && q == poison && pend == 0 && d >= orders, fmt.Sprintf("coupons=%d duplicates=%d poison=%d pending=%d", c, d, q, pend)
	})
	if n := count(t, db, "SELECT COUNT(*) FROM coupon_grant WHERE state = 'GRANTED'"); n != orders {
		t.Errorf("%d grants GRANTED, want %d", n, orders)
	}
	deliveries := int(recvA.Load() + recvB.Load())
	dups := count(t, db, "SELECT COALESCE(SUM(duplicates), 0) FROM inbox WHERE status = 'done'")
	sa, sb := batcherA.Stats(), batcherB.Stats()
	t.Logf("deliveries %d (%d + %d), duplicates counted %d; batcher A %+v, B %+v", deliveries, recvA.Load(), recvB.Load(), dups, sa, sb)
	if sa.MaxBatched < 2 && sb.MaxBatched < 2 {
		t.Errorf("no batch held more than one delivery: group commit did not happen")
	}
	if recvB.Load() == 0 {
		t.Errorf("router B received nothing: no partition moved")
	}

	recs, err := kc.ReadAll(context.Background(), granted, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if bad := eventsPerOrder(recs, orders, id); len(bad) > 0 {
		t.Fatalf("granted topic: %d problems, first: %v", len(bad), bad[:min(5, len(bad))])
	}
	// The check can fail. It catches a record published twice.
	if bad := eventsPerOrder(append(recs, recs[len(recs)/2]), orders, id); len(bad) == 0 {
		t.Fatal("an injected duplicate record went unnoticed")
	}
}

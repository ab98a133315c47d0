package engine_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// startRouter runs a Watermill router consuming topic in group through ib until the
// returned stop function is called.
func startRouter(t *testing.T, kc kafkax.Config, group, topic string, ib *engine.Inbox) (stop func()) {
	return startRouterObserved(t, kc, group, topic, ib, nil)
}

// startRouterObserved also calls onReceive with every message before the inbox sees it.
func startRouterObserved(t *testing.T, kc kafkax.Config, group, topic string, ib *engine.Inbox, onReceive func(*message.Message)) (stop func()) {
	t.Helper()
	sub, err := kc.NewSubscriber(group, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	h := ib.HandlerFunc(topic)
	return runRouter(t, sub, topic, func(m *message.Message) error {
		if onReceive != nil {
			onReceive(m)
		}
		return h(m)
	}, nil)
}

// runRouter runs a Watermill router with one handler until the returned stop function is
// called. It then calls after, if after is set.
func runRouter(t *testing.T, sub message.Subscriber, topic string, h message.NoPublishHandlerFunc, after func()) (stop func()) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddConsumerHandler("h", topic, sub, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	<-r.Running()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if after != nil {
				after()
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func produce(t *testing.T, kc kafkax.Config, topic string, msgs ...[2]string) {
	t.Helper()
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var batch []*sarama.ProducerMessage
	for _, m := range msgs {
		batch = append(batch, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(m[0]), Value: sarama.StringEncoder(m[1]),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}})
	}
	if err := p.SendMessages(batch); err != nil {
		t.Fatal(err)
	}
}

func orderJSON(id, user string) string {
	return string(coupon.OrderPaid{OrderID: id, UserID: user, AmountCents: 999, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}.Encode())
}

func waitFor(t *testing.T, what string, limit time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", limit, what, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKafkaEndToEnd runs end to end on the real broker. The same order, sent as two
// different Kafka messages, gives one coupon and one CouponGranted event on the granted
// topic. Poison in the same partition is quarantined, and the partition keeps flowing.
func TestKafkaEndToEnd(t *testing.T) {
	kc := testenv.Kafka(t)
	in := testenv.Topic(t, kc, "order-paid", 1)
	granted := testenv.Topic(t, kc, "coupon-granted", 3)
	p := newPipeline(t, pipelineOpts{grantedTopic: granted})
	producer, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	relay, err := outbox.NewRelay(p.db.DB, producer, outbox.RelayConfig{PollInterval: 20 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	go func() { _ = relay.Run(rctx) }()

	msgs := [][2]string{
		{"20261111-8842", orderJSON("20261111-8842", "u1")},
		{"x", `{"orderId": "bad`},
		{"20261111-8842", orderJSON("20261111-8842", "u1")}, // the duplicate, a different message
		{"x", `{"userId": "u9"}`},
		{"x", `{"orderId": 7, "userId": "u9"}`},
	}
	for i := range 20 {
		id := fmt.Sprintf("after-poison-%02d", i)
		msgs = append(msgs, [2]string{id, orderJSON(id, "u2")})
	}
	produce(t, kc, in, msgs...)
	startRouter(t, kc, "g-"+in, in, p.inbox)

	db := p.db.DB
	waitFor(t, "21 coupons, 3 quarantined, outbox drained", 60*time.Second, func() (bool, string) {
		c := count(t, db, "SELECT COUNT(*) FROM user_coupon")
		q := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason = 'poison'")
		pend := count(t, db, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL")
		o := count(t, db, "SELECT COUNT(*) FROM outbox")
		return c == 21 && q == 3 && pend == 0 && o == 21, fmt.Sprintf("coupons=%d quarantined=%d outbox=%d pending=%d", c, q, o, pend)
	})
	if n := count(t, db, "SELECT duplicates FROM inbox WHERE dedup_key = '20261111-8842'"); n != 1 {
		t.Fatalf("duplicates blocked = %d, want 1", n)
	}
	recs, err := kc.ReadAll(context.Background(), granted, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	perOrder := map[string]int{}
	ids := map[string]bool{}
	for _, r := range recs {
		perOrder[r.Key]++
		ids[r.Headers[outbox.HeaderEventID]] = true
	}
	if perOrder["20261111-8842"] != 1 || len(recs) != 21 || len(ids) != 21 {
		t.Fatalf("grant events: %d records, %d distinct ids, %d for the duplicated order; want 21/21/1", len(recs), len(ids), perOrder["20261111-8842"])
	}
}

// TestStalledConsumerLosesPartition stalls a consumer inside a step past the rebalance
// timeout. A second consumer joins, takes the partition and reads the same message again.
// So both run the same order at once. The inbox row lock and the state machine's CAS make
// it one coupon, with stock and budget counted once.
func TestStalledConsumerLosesPartition(t *testing.T) {
	kc := testenv.Kafka(t)
	kc.SessionTimeout = 6 * time.Second
	kc.RebalanceTimeout = 3 * time.Second
	kc.HeartbeatEvery = time.Second
	in := testenv.Topic(t, kc, "order-paid", 1)
	group := "g-" + in

	shared := testenv.DB(t, 16, couponSchema)
	stalled := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	calls := map[string]int{}    // consumer → handler calls for the hot order
	received := map[string]int{} // consumer → deliveries of the hot order
	mk := func(name string, stall bool) *engine.Inbox {
		var once sync.Once
		return newPipeline(t, pipelineOpts{shared: &shared, wrap: func(g inbox.Handler) inbox.Handler {
			return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
				if d.Key == "hot" {
					mu.Lock()
					calls[name]++
					mu.Unlock()
					if stall && d.Step == 1 {
						once.Do(func() {
							close(stalled)
							<-release // the seed's 2 s external call, stretched past the rebalance
						})
					}
				}
				return g.Handle(ctx, tx, d)
			}}
		}}).inbox
	}
	ibA := mk("A", true)
	ibB := mk("B", false)

	produce(t, kc, in, [2]string{"hot", orderJSON("hot", "u1")})
	startRouter(t, kc, group, in, ibA)
	select {
	case <-stalled:
	case <-time.After(60 * time.Second):
		t.Fatal("consumer A never received the order")
	}
	// B joins. A cannot leave its claim while its handler is stuck. So after the rebalance
	// timeout the broker drops A, and B reads the uncommitted message again.
	startRouterObserved(t, kc, group, in, ibB, func(*message.Message) {
		mu.Lock()
		received["B"]++
		mu.Unlock()
	})
	waitFor(t, "consumer B to receive the same order while A is stalled", 60*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return received["B"] > 0, fmt.Sprintf("received %v calls %v", received, calls)
	})
	// B is now inside the inbox for the same key, waiting on the row lock A holds.
	time.Sleep(500 * time.Millisecond)
	close(release)
	db := shared.DB
	waitFor(t, "the order to be granted", 60*time.Second, func() (bool, string) {
		n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE dedup_key = 'hot' AND status = 'done'")
		return n == 1, fmt.Sprintf("done rows %d", n)
	})
	time.Sleep(2 * time.Second) // let the losing consumer finish whatever it was doing
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'hot'"); n != 1 {
		t.Fatalf("coupons = %d, want 1", n)
	}
	if n := count(t, db, "SELECT SUM(granted + locked) FROM coupon_stock"); n != 1 {
		t.Fatalf("stock used = %d, want 1", n)
	}
	if n := count(t, db, "SELECT SUM(spent_cents) FROM coupon_budget"); n != 500 {
		t.Fatalf("budget spent = %d, want 500", n)
	}
	mu.Lock()
	t.Logf("hot order: B received it %d times; handler steps run per consumer: %v", received["B"], calls)
	mu.Unlock()
}

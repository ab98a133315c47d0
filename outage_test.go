package onceflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	onceflow "github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
)

// switchedService is the coupon service the test takes down and brings back.
type switchedService struct {
	down  atomic.Bool
	calls atomic.Int64 // calls made while down
}

func (s *switchedService) Instant() bool { return true }

func (s *switchedService) Call(_ context.Context, step, key string) error {
	if s.down.Load() {
		s.calls.Add(1)
		return fmt.Errorf("coupon service down: %s (%s)", step, key)
	}
	return nil
}

// outagePlugin is the coupon plugin as the router runs it, its outside service svc.
func outagePlugin(svc coupon.ExternalService) inbox.Plugin {
	p := coupon.Plugin()
	p.Build = func(ctx context.Context, env inbox.PluginEnv) (inbox.Handler, error) {
		cfg := coupon.DefaultConfig()
		if err := coupon.EnsureCampaign(ctx, env.DB, cfg); err != nil {
			return nil, err
		}
		g, err := coupon.NewGranter(cfg, svc, env.Logger)
		if err != nil {
			return nil, err
		}
		return g.Handler(env.DB)
	}
	return p
}

// The acceptance test: orders keep arriving through a real Kafka topic into the
// router's runtime while the coupon service is down for a minute. With the defaults
// (delayed redelivery and the circuit breaker on) every order is granted exactly once, none
// is quarantined and the committed offsets reach the end of every partition. The same
// scenario with both turned off quarantines orders (a shorter outage shows it: the
// immediate attempts are used up in about 1.5 s).
func TestCouponServiceOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a one-minute outage")
	}
	for _, tc := range []struct {
		name   string
		off    bool // inbox.delayed_retries 0 and inbox.breaker_enabled false
		outage time.Duration
	}{
		{"delayed redelivery and breaker off", true, 5 * time.Second},
		{"defaults", false, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.Integration(t)
			d := testenv.DB(t, 16, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
			kc := testenv.Kafka(t)
			topic := testenv.Topic(t, kc, "order-paid", 3)
			group := "g-" + topic
			svc := &switchedService{}
			p := outagePlugin(svc)

			cfg := onceflow.DefaultConfig()
			cfg.DB.DSN = d.DSN
			cfg.Kafka.Brokers = kc.Brokers
			cfg.Admin.Listen = ""
			cfg.Relay.Enabled = false
			cfg.Relay.CheckTopics = false
			cfg.Plugins = map[string]map[string]any{p.Name: {"topics": []any{topic}, "consumer_group": group}}
			if tc.off {
				cfg.Inbox.DelayedRetries = 0 // a configured 0: off
				cfg.Inbox.BreakerEnabled = false
			}
			rt, err := onceflow.New(cfg, []inbox.Plugin{p}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- rt.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			}()

			producer, err := kc.NewSyncProducer()
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Close()
			orders := 0
			send := func() {
				id := fmt.Sprintf("o-%05d", orders)
				o := coupon.OrderPaid{OrderID: id, UserID: "u-" + id, AmountCents: 999, PaidAt: time.Now().UTC()}
				_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(id), Value: sarama.ByteEncoder(o.Encode()),
					Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}})
				if err != nil {
					t.Fatal(err)
				}
				orders++
			}
			// Orders arrive before, during and after the outage, 20 a second.
			phase := func(d time.Duration) {
				for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
					send()
				}
			}
			phase(3 * time.Second)
			svc.down.Store(true)
			phase(tc.outage)
			svc.down.Store(false)
			phase(2 * time.Second)
			t.Logf("%d orders sent, %d calls into the service while it was down", orders, svc.calls.Load())

			var quarantined, granted, dupCoupons, settled int
			var lag map[int32]int64
			deadline := time.Now().Add(90 * time.Second)
			for {
				quarantined = countRows(t, d, `SELECT COUNT(*) FROM inbox WHERE biz_type = 'coupon' AND status = 'failed' AND COALESCE(reason, '') <> 'delayed'`)
				settled = countRows(t, d, `SELECT COUNT(*) FROM inbox WHERE biz_type = 'coupon' AND (status = 'done' OR status = 'failed' AND COALESCE(reason, '') <> 'delayed')`)
				granted = countRows(t, d, `SELECT COUNT(DISTINCT order_id) FROM user_coupon`)
				dupCoupons = countRows(t, d, `SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM user_coupon`)
				lag = testenv.CommittedLag(t, kc, group, topic)
				caughtUp := true
				for _, n := range lag {
					caughtUp = caughtUp && n == 0
				}
				if settled == orders && caughtUp {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not settled: %d of %d orders done or quarantined, lag %v", settled, orders, lag)
				}
				time.Sleep(500 * time.Millisecond)
			}
			t.Logf("%d orders: %d granted, %d duplicate coupons, %d quarantined, lag %v", orders, granted, dupCoupons, quarantined, lag)
			if dupCoupons != 0 {
				t.Fatalf("%d duplicate coupons", dupCoupons)
			}
			if tc.off {
				if quarantined == 0 {
					t.Fatal("no order quarantined without delayed redelivery and the breaker: the scenario shows nothing")
				}
				return
			}
			if quarantined != 0 || granted != orders {
				t.Fatalf("%d of %d orders granted, %d quarantined; want every order granted once, none quarantined", granted, orders, quarantined)
			}
		})
	}
}

func countRows(t *testing.T, d testenv.Database, q string) int {
	t.Helper()
	var n int
	if err := d.DB.QueryRow(q).Scan(&n); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

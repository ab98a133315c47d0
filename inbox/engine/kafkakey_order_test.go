package engine_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestDelayedHoldsKafkaKey sends two orders under one Kafka key. The first is delayed
// while its dependency is down. By default order holds per business key, so the second is
// granted while the first waits. With inbox.delayed_holds_kafka_key the first stays
// unacked until its row ends. So the second waits behind it and is granted after it. That
// holds through the parallel subscriber, with its per-key order, and group commit alike.
func TestDelayedHoldsKafkaKey(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holds   bool
		batched bool
	}{
		{"per business key", false, false},
		{"per Kafka key", true, false},
		{"per Kafka key, group commit", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := testenv.Kafka(t)
			topic := testenv.Topic(t, kc, "order-paid", 1)
			var down atomic.Bool
			var calls atomic.Int64
			down.Store(true)
			var mu sync.Mutex
			var granted []string
			p := newPipeline(t, pipelineOpts{outage: true, plugin: true, wrap: func(h inbox.Handler) inbox.Handler {
				failing := failingOrder("dly-1", &down, &calls)(h)
				return handlerFunc{inner: h, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
					prog, err := failing.Handle(ctx, tx, d)
					if err == nil && prog == inbox.Done {
						mu.Lock()
						granted = append(granted, d.Key)
						mu.Unlock()
					}
					return prog, err
				}}
			}, inboxCfg: engine.Config{MaxAttempts: 2, DelayedRetries: 100, DelayedBackoff: 100 * time.Millisecond, DelayedBackoffMax: 200 * time.Millisecond,
				RedeliverEvery: 20 * time.Millisecond, BreakerOff: true, DelayedHoldsKafkaKey: tc.holds}})
			ctx, cancel := context.WithCancel(context.Background())
			redelivering := make(chan struct{})
			go func() { defer close(redelivering); _ = p.inbox.RunRedeliveries(ctx) }()
			defer func() { cancel(); <-redelivering }()
			group := "g-" + topic
			sub, err := kc.NewParallelSubscriber(group, kafkax.ParallelConfig{Window: 16}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			h := p.inbox.HandlerFunc(topic)
			if tc.batched {
				b, err := p.inbox.NewBatcher(engine.BatchConfig{})
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				h = b.HandlerFunc(topic)
			}
			stop := runRouter(t, sub, topic, h, nil)
			defer stop()
			produce(t, kc, topic, [2]string{"K", orderJSON("dly-1", "u1")}, [2]string{"K", orderJSON("dly-2", "u2")}, [2]string{"other", orderJSON("dly-3", "u3")})

			waitFor(t, "dly-1 delayed twice, dly-3 granted", 30*time.Second, func() (bool, string) {
				st, r, rounds := rowState(t, p.db.DB, "dly-1")
				other, _, _ := rowState(t, p.db.DB, "dly-3")
				return st == "failed" && r == "delayed" && rounds >= 2 && other == "done", fmt.Sprintf("dly-1 %s/%s after %d rounds, dly-3 %q", st, r, rounds, other)
			})
			if tc.holds {
				if st, _, _ := rowState(t, p.db.DB, "dly-2"); st != "" {
					t.Fatalf("dly-2 is %q while dly-1, before it under the same Kafka key, waits", st)
				}
			} else {
				waitFor(t, "dly-2 granted while dly-1 waits", 30*time.Second, func() (bool, string) {
					st, _, _ := rowState(t, p.db.DB, "dly-2")
					return st == "done", st
				})
			}
			down.Store(false)
			waitFor(t, "every order granted, the offset committed", 30*time.Second, func() (bool, string) {
				n := count(t, p.db.DB, `SELECT COUNT(*) FROM inbox WHERE status = 'done'`)
				lag := testenv.CommittedLag(t, kc, group, topic)
				return n == 3 && lag[0] == 0, fmt.Sprintf("%d done, lag %v", n, lag)
			})
			mu.Lock()
			defer mu.Unlock()
			at := map[string]int{}
			for i, k := range granted {
				at[k] = i
			}
			if len(granted) != 3 || (at["dly-1"] < at["dly-2"]) != tc.holds {
				t.Fatalf("granted in the order %v (holds the Kafka key: %v)", granted, tc.holds)
			}
		})
	}
}

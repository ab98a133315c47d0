package engine_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// failingOrder wraps the granter. Every attempt of order fails while down is set, as when
// the dependency that order's grant calls is down. Other orders go through. calls counts
// the calls made into the failing dependency.
func failingOrder(order string, down *atomic.Bool, calls *atomic.Int64) func(inbox.Handler) inbox.Handler {
	return func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if (order == "" || d.Key == order) && down.Load() {
				calls.Add(1)
				return inbox.Continue, errors.New("wallet service down")
			}
			return g.Handle(ctx, tx, d)
		}}
	}
}

// rowState reads a row's status, reason and delayed rounds.
func rowState(t *testing.T, db *sql.DB, key string) (status, reason string, rounds int) {
	t.Helper()
	var r sql.NullString
	err := db.QueryRow(testenv.Rebind(`SELECT status, reason, delayed_rounds FROM inbox WHERE dedup_key = ? AND biz_type = ?`), key, coupon.BizType).Scan(&status, &r, &rounds)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return status, r.String, rounds
}

// TestDelayedRedelivery checks a delivery that fails for longer than its immediate
// attempts take. Without delayed redelivery it is quarantined. With it, its row waits, and
// a later round grants the order once. Meanwhile the delivery is acked, the partition's
// other keys are processed and its offset is committed. When the rounds run out, the
// delivery is quarantined as retries_exhausted.
func TestDelayedRedelivery(t *testing.T) {
	for _, tc := range []struct {
		name    string
		delayed int  // inbox.delayed_retries (-1: off)
		recover bool // the dependency comes back once the row had two rounds
		want    string
	}{
		{"off: quarantined", -1, false, "failed/retries_exhausted"},
		{"on: delayed, then granted once", 100, true, "done/"},
		{"on: rounds used up", 2, false, "failed/retries_exhausted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := testenv.Kafka(t)
			topic := testenv.Topic(t, kc, "order-paid", 1)
			var down atomic.Bool
			var calls atomic.Int64
			down.Store(true)
			p := newPipeline(t, pipelineOpts{outage: true, wrap: failingOrder("A", &down, &calls), inboxCfg: engine.Config{
				MaxAttempts: 2, DelayedRetries: tc.delayed, DelayedBackoff: 100 * time.Millisecond, DelayedBackoffMax: 200 * time.Millisecond,
				RedeliverEvery: 20 * time.Millisecond, BreakerOff: true}})
			ctx, cancel := context.WithCancel(context.Background())
			redelivering := make(chan struct{})
			go func() { defer close(redelivering); _ = p.inbox.RunRedeliveries(ctx) }()
			defer func() { cancel(); <-redelivering }()
			group := "g-" + topic
			startRouter(t, kc, group, topic, p.inbox)
			produce(t, kc, topic, [2]string{"A", orderJSON("A", "u1")}, [2]string{"B", orderJSON("B", "u2")}, [2]string{"C", orderJSON("C", "u3")})

			// A's failure does not hold the partition. B and C behind it are granted, and
			// the group's offset reaches the partition's end while A's outcome is pending
			// or quarantined.
			waitFor(t, "B and C granted, the offset committed", 30*time.Second, func() (bool, string) {
				n := count(t, p.db.DB, `SELECT COUNT(*) FROM inbox WHERE dedup_key IN ('B', 'C') AND status = 'done'`)
				lag := testenv.CommittedLag(t, kc, group, topic)
				return n == 2 && lag[0] == 0, fmt.Sprintf("%d done, lag %v", n, lag)
			})
			if tc.recover {
				waitFor(t, "A delayed twice", 30*time.Second, func() (bool, string) {
					st, r, rounds := rowState(t, p.db.DB, "A")
					return st == "failed" && r == "delayed" && rounds >= 2, fmt.Sprintf("%s/%s after %d rounds", st, r, rounds)
				})
				if n := count(t, p.db.DB, `SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason <> 'delayed'`); n != 0 {
					t.Fatalf("%d rows quarantined while A waits", n)
				}
				down.Store(false)
			}
			waitFor(t, "A's end", 30*time.Second, func() (bool, string) {
				st, r, rounds := rowState(t, p.db.DB, "A")
				return st+"/"+r == tc.want, fmt.Sprintf("%s/%s after %d rounds", st, r, rounds)
			})
			wantCoupons := map[bool]int{true: 1, false: 0}[tc.recover]
			if n := count(t, p.db.DB, `SELECT COUNT(*) FROM user_coupon WHERE order_id = 'A'`); n != wantCoupons {
				t.Fatalf("order A has %d coupons, want %d", n, wantCoupons)
			}
			if _, _, rounds := rowState(t, p.db.DB, "A"); tc.delayed == 2 && rounds != 2 {
				t.Fatalf("A quarantined after %d delayed rounds, want 2", rounds)
			}
			t.Logf("A: %s after %d calls into the failing dependency", tc.want, calls.Load())
		})
	}
}

// TestCircuitBreaker fails every call, so the breaker opens after breaker_min_calls. The
// deliveries then wait instead of spending their attempts, and none is quarantined. The
// calls into the failing dependency stop at about one attempt per delivery, plus the
// probes. Once the dependency is back, a probe closes the breaker and every delivery is
// processed. Without the breaker every delivery spends its attempts and is quarantined.
func TestCircuitBreaker(t *testing.T) {
	const deliveries, attempts = 40, 10
	for _, breaker := range []bool{false, true} {
		t.Run(fmt.Sprintf("breaker=%v", breaker), func(t *testing.T) {
			var down atomic.Bool
			var calls atomic.Int64
			down.Store(true)
			p := newPipeline(t, pipelineOpts{conns: deliveries + 8, outage: true, wrap: failingOrder("", &down, &calls), inboxCfg: engine.Config{
				MaxAttempts: attempts, DelayedRetries: -1, BreakerOff: !breaker, BreakerMinCalls: 20, BreakerFailureRatio: 0.9,
				BreakerOpenFor: 100 * time.Millisecond,
				// These backoffs are of a real dependency's order, not the helpers' 1-10 ms.
				// The breaker counts deliveries, and all 40 make their first attempt long
				// before any makes its tenth.
				BackoffInitial: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
			var wg sync.WaitGroup
			results := make([]engine.Result, deliveries)
			for i := range deliveries {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprintf("o%02d", i)
					r, err := p.inbox.Process(context.Background(), orderMsg(key, "u"+key), inbox.Source{Topic: "order-paid", Offset: int64(i)}, engine.ProcessOptions{})
					if err != nil {
						t.Errorf("%s: %v", key, err)
					}
					results[i] = r
				}()
			}
			if breaker {
				waitFor(t, "the breaker open and a probe failed", 30*time.Second, func() (bool, string) {
					s := p.inbox.Breaker()
					return s.Opens >= 2, fmt.Sprintf("%v, opened %d times", s.State, s.Opens)
				})
				down.Store(false)
			}
			wg.Wait()
			down.Store(false)
			outcomes := map[engine.Outcome]int{}
			for _, r := range results {
				outcomes[r.Outcome]++
			}
			failed := count(t, p.db.DB, `SELECT COUNT(*) FROM inbox WHERE status = 'failed'`)
			t.Logf("outcomes %v, %d calls into the failing dependency, %d rows quarantined", outcomes, calls.Load(), failed)
			if !breaker {
				if failed != deliveries || calls.Load() != deliveries*attempts {
					t.Fatalf("without the breaker: %d quarantined and %d calls, want %d and %d", failed, calls.Load(), deliveries, deliveries*attempts)
				}
				return
			}
			if failed != 0 || outcomes[engine.OutcomeProcessed] != deliveries {
				t.Fatalf("with the breaker: outcomes %v, %d quarantined; want all %d processed", outcomes, failed, deliveries)
			}
			if c := calls.Load(); c >= deliveries*attempts/2 {
				t.Fatalf("with the breaker: %d calls into the failing dependency, want well under the %d attempts it would take", c, deliveries*attempts)
			}
			if n := count(t, p.db.DB, `SELECT COUNT(*) FROM user_coupon`); n != deliveries {
				t.Fatalf("%d coupons, want %d", n, deliveries)
			}
			if s := p.inbox.Breaker(); s.State != engine.BreakerClosed {
				t.Fatalf("breaker %v after the dependency recovered", s.State)
			}
		})
	}
}

// TestBreakerWaitEndsWithContext checks that a delivery waiting on an open breaker stops
// when its context ends, on a shutdown or a rebalance. It returns an error, is not acked,
// and spends nothing.
func TestBreakerWaitEndsWithContext(t *testing.T) {
	var down atomic.Bool
	var calls atomic.Int64
	down.Store(true)
	p := newPipeline(t, pipelineOpts{outage: true, wrap: failingOrder("", &down, &calls), inboxCfg: engine.Config{
		MaxAttempts: 100, DelayedRetries: -1, BreakerMinCalls: 3, BreakerOpenFor: time.Hour}})
	// Three deliveries fail together, because the breaker counts deliveries, not a few
	// retried ones.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := p.inbox.Process(ctx, orderMsg(fmt.Sprintf("w%d", i), "u"), inbox.Source{Topic: "order-paid", Offset: int64(i)}, engine.ProcessOptions{})
			errs <- err
		}()
	}
	for p.inbox.Breaker().State != engine.BreakerOpen {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	for i := range 3 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("delivery %d: %v, want context.Canceled", i, err)
		}
	}
	if s := p.inbox.Breaker(); s.State != engine.BreakerOpen {
		t.Fatalf("breaker %v, want open", s.State)
	}
	if n := count(t, p.db.DB, `SELECT COUNT(*) FROM inbox WHERE status = 'failed'`); n != 0 {
		t.Fatalf("%d rows quarantined", n)
	}
}

// TestGroupedFailureDelayed checks that under group commit a delivery that keeps failing in
// its batch is delayed, not quarantined, once its attempts run out. A panic and
// ErrPermanent are quarantined at once.
func TestGroupedFailureDelayed(t *testing.T) {
	h := newEffects()
	h.misbehave = func(_ context.Context, key string, _ int) error {
		switch {
		case strings.HasPrefix(key, "always-"):
			return errors.New("downstream keeps failing")
		case strings.HasPrefix(key, "permanent-"):
			return inbox.Permanent(errors.New("this order can never be credited"))
		case strings.HasPrefix(key, "panic-"):
			panic("plugin bug on " + key)
		}
		return nil
	}
	g := newGrouped(t, h, engine.Config{MaxAttempts: 2, DelayedRetries: 3, DelayedBackoff: time.Hour, DelayedBackoffMax: time.Hour},
		engine.BatchConfig{Linger: 100 * time.Millisecond})
	rs := g.send(t, append(keys("ok", 10), "always-1", "permanent-1", "panic-1"))
	want := map[string]int{"processed": 10, "delayed/delayed": 1, "quarantined/permanent": 1, "quarantined/panic": 1}
	if o := outcomes(rs); fmt.Sprint(o) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", o, want)
	}
	if n := count(t, g.db.DB, `SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason = 'delayed' AND delayed_rounds = 1 AND retry_at IS NOT NULL`); n != 1 {
		t.Fatalf("%d rows waiting for their first delayed round, want 1", n)
	}
}

// TestRedeliveriesRunSideBySide checks that due rows are redelivered side by side. A
// handler that waits for its peers, as on a slow or hanging dependency, holds one slot, not
// the backlog. Each redelivery here returns only once all four are running at the same
// time. Otherwise it gives up after 15 s and fails. One at a time, none of them would be
// granted.
func TestRedeliveriesRunSideBySide(t *testing.T) {
	const rows = 4
	var down atomic.Bool
	down.Store(true)
	var inside atomic.Int32
	allIn := make(chan struct{})
	var once sync.Once
	wrap := func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if down.Load() {
				return inbox.Continue, errors.New("dependency down")
			}
			if d.Step == 0 {
				if inside.Add(1) == rows {
					once.Do(func() { close(allIn) })
				}
				select {
				case <-allIn:
				case <-time.After(15 * time.Second):
					return inbox.Continue, errors.New("the other redeliveries never ran beside this one")
				case <-ctx.Done():
					return inbox.Continue, ctx.Err()
				}
			}
			return g.Handle(ctx, tx, d)
		}}
	}
	p := newPipeline(t, pipelineOpts{outage: true, wrap: wrap, inboxCfg: engine.Config{
		MaxAttempts: 1, DelayedRetries: 5, BreakerOff: true, HandlerTimeout: time.Minute}})
	ctx := context.Background()
	for i := range rows {
		key := fmt.Sprintf("s%d", i)
		r, err := p.inbox.Process(ctx, orderMsg(key, "u"+key), inbox.Source{Topic: "order-paid", Offset: int64(i)}, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeDelayed {
			t.Fatalf("%s: %+v %v, want delayed", key, r, err)
		}
	}
	down.Store(false)
	ran, err := p.inbox.RedeliverDue(ctx, time.Now().Add(time.Hour))
	if err != nil || ran != rows {
		t.Fatalf("redelivered %d rows: %v, want %d", ran, err, rows)
	}
	if n := count(t, p.db.DB, `SELECT COUNT(*) FROM inbox WHERE status = 'done'`); n != rows {
		t.Fatalf("%d rows done, want %d (the redeliveries ran one at a time)", n, rows)
	}
}

// TestBreakerCountsDeliveries checks that the breaker counts failed deliveries, not
// attempts. One bad message retried many times, with nothing else arriving, leaves it
// closed, and is quarantined when its attempts run out. It does not open the breaker and
// hold every delivery behind probes that keep failing.
func TestBreakerCountsDeliveries(t *testing.T) {
	var down atomic.Bool
	var calls atomic.Int64
	down.Store(true)
	p := newPipeline(t, pipelineOpts{outage: true, wrap: failingOrder("bad", &down, &calls), inboxCfg: engine.Config{
		MaxAttempts: 10, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond, DelayedRetries: -1,
		BreakerMinCalls: 3, BreakerOpenFor: time.Hour}})
	r, err := p.inbox.Process(context.Background(), orderMsg("bad", "u"), inbox.Source{Topic: "order-paid"}, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeQuarantined || calls.Load() != 10 {
		t.Fatalf("%+v %v after %d calls, want quarantined after 10", r, err, calls.Load())
	}
	if s := p.inbox.Breaker(); s.State != engine.BreakerClosed || s.Opens != 0 {
		t.Fatalf("breaker %v (opened %d times) after one delivery's retries, want closed", s.State, s.Opens)
	}
}

// TestRedeliveriesIdleBackOff: with no row waiting for a delayed redelivery, the
// redeliverer's looks back off (RedeliverEvery 20 ms, doubling up to 8 s), and a row this
// inbox delays ends the backoff at once. Looking every 20 ms would have made about 100
// looks in the first 2 s. After the ninth look the next is 5 s away. A delivery delayed
// then is still run again about its 100 ms backoff later, and granted once.
func TestRedeliveriesIdleBackOff(t *testing.T) {
	var down atomic.Bool
	var calls atomic.Int64
	down.Store(true)
	p := newPipeline(t, pipelineOpts{outage: true, wrap: failingOrder("A", &down, &calls), inboxCfg: engine.Config{
		MaxAttempts: 1, DelayedRetries: 100, DelayedBackoff: 100 * time.Millisecond, DelayedBackoffMax: 100 * time.Millisecond,
		RedeliverEvery: 20 * time.Millisecond, BreakerOff: true}})
	ctx, cancel := context.WithCancel(context.Background())
	redelivering := make(chan struct{})
	go func() { defer close(redelivering); _ = p.inbox.RunRedeliveries(ctx) }()
	defer func() { cancel(); <-redelivering }()

	time.Sleep(2 * time.Second)
	if n := p.inbox.RedeliveryLooks(); n > 12 {
		t.Errorf("%d looks for due redeliveries in 2 s with nothing delayed, want at most 12 (backing off from 20 ms)", n)
	}
	// The ninth look comes about 5.1 s in; the next would be 5.12 s after it.
	waitFor(t, "the ninth look", 30*time.Second, func() (bool, string) {
		return p.inbox.RedeliveryLooks() >= 9, fmt.Sprintf("%d looks", p.inbox.RedeliveryLooks())
	})
	time.Sleep(300 * time.Millisecond) // the look has ended
	r, err := p.inbox.Process(context.Background(), orderMsg("A", "u1"), inbox.Source{Topic: "order-paid"}, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeDelayed {
		t.Fatalf("A: %+v, %v; want it delayed", r, err)
	}
	delayedAt := time.Now()
	waitFor(t, "A run again", 30*time.Second, func() (bool, string) {
		return calls.Load() >= 2, fmt.Sprintf("%d calls", calls.Load())
	})
	if d := time.Since(delayedAt); d > 2*time.Second {
		t.Errorf("A was run again %s after it was delayed, want about its 100 ms backoff (the delay ends the redeliverer's idle wait)", d)
	}
	down.Store(false)
	waitFor(t, "A granted", 30*time.Second, func() (bool, string) {
		st, r, rounds := rowState(t, p.db.DB, "A")
		return st == "done", fmt.Sprintf("%s/%s after %d rounds", st, r, rounds)
	})
	if n := count(t, p.db.DB, `SELECT COUNT(*) FROM user_coupon WHERE order_id = 'A'`); n != 1 {
		t.Fatalf("order A has %d coupons, want 1", n)
	}
}

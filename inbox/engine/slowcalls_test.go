package engine_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// slowService is a slow downstream. Each call sleeps delay(key) and is recorded.
type slowService struct {
	delay    func(key string) time.Duration
	inFlight atomic.Int64
	peak     atomic.Int64
	mu       sync.Mutex
	calls    map[string]int           // order id → calls made for it
	hang     map[string]chan struct{} // order id → its calls wait until this is closed
}

func newSlowService(delay func(key string) time.Duration) *slowService {
	return &slowService{delay: delay, calls: map[string]int{}}
}

func (s *slowService) Call(ctx context.Context, step, key string) error {
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	order, _, _ := strings.Cut(key, ":")
	s.mu.Lock()
	s.calls[order]++
	s.mu.Unlock()
	if h := s.hang[order]; h != nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h:
		}
	}
	t := time.NewTimer(s.delay(order))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (s *slowService) callsFor(order string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[order]
}

// submit runs each order through b.Process on its own goroutine, as the router does. It
// returns the results in completion order.
func submit(t *testing.T, b *engine.Batcher, ids []string, gap time.Duration) <-chan engine.Result {
	t.Helper()
	out := make(chan engine.Result, len(ids))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	for i, id := range ids {
		go func() {
			r, err := b.Process(ctx, orderMsg(id, "u"), inbox.Source{Topic: "order-paid", Offset: int64(i)})
			if err != nil {
				t.Errorf("%s: %v", id, err)
			}
			out <- r
		}()
		if gap > 0 {
			time.Sleep(gap)
		}
	}
	return out
}

// TestSlowCallsInFlightFollowTheSetting checks that the calls of every delivery run at
// once, up to inbox.max_in_flight_calls. The peak of concurrent calls follows the setting.
// So throughput under slow calls grows with it, bounded by calls in flight ÷ call time.
// Calls made inside the batch pipeline would be capped per batch, whatever the setting.
func TestSlowCallsInFlightFollowTheSetting(t *testing.T) {
	for _, limit := range []int{16, 256} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			svc := newSlowService(func(string) time.Duration { return 200 * time.Millisecond })
			p := newPipeline(t, pipelineOpts{conns: 16, svc: svc, plugin: true, inboxCfg: engine.Config{MaxInFlightCalls: limit}})
			b, err := p.inbox.NewBatcher(engine.BatchConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			const orders = 300
			ids := make([]string, orders)
			for i := range ids {
				ids[i] = fmt.Sprintf("fl-%d-%03d", limit, i)
			}
			start := time.Now()
			res := submit(t, b, ids, 0)
			for range orders {
				if r := <-res; r.Outcome != engine.OutcomeProcessed {
					t.Fatalf("outcome %s (%s)", r.Outcome, r.Reason)
				}
			}
			elapsed := time.Since(start)
			peak := svc.peak.Load()
			t.Logf("max_in_flight_calls %d: %d orders (3 calls of 200 ms each) in %s, peak %d calls in flight, stats %+v",
				limit, orders, elapsed.Round(time.Millisecond), peak, b.Stats())
			if want := int64(min(limit, orders)); peak < want*9/10 || peak > want {
				t.Fatalf("peak calls in flight %d, want about %d (the setting)", peak, want)
			}
			if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon"); n != orders {
				t.Fatalf("%d coupons, want %d", n, orders)
			}
		})
	}
}

// TestSlowOrderDoesNotHoldBackFastOnes checks that one slow order does not hold back the
// fast ones that arrive with it. While its call hangs, every fast order is granted. A
// batch's transaction that waited for its slowest member's calls would make the fast
// orders collected with it wait as long.
func TestSlowOrderDoesNotHoldBackFastOnes(t *testing.T) {
	hang := make(chan struct{})
	svc := newSlowService(func(order string) time.Duration { return 10 * time.Millisecond })
	svc.hang = map[string]chan struct{}{"slow-1": hang}
	p := newPipeline(t, pipelineOpts{conns: 16, svc: svc, plugin: true})
	b, err := p.inbox.NewBatcher(engine.BatchConfig{Linger: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ids := []string{"slow-1"}
	for i := range 40 {
		ids = append(ids, fmt.Sprintf("fast-%02d", i))
	}
	res := submit(t, b, ids, 0)
	timeout := time.After(20 * time.Second)
	for i := range 40 {
		select {
		case r := <-res:
			if r.Key == "slow-1" || r.Outcome != engine.OutcomeProcessed {
				t.Fatalf("%s: outcome %s while the slow order's call hangs", r.Key, r.Outcome)
			}
		case <-timeout:
			close(hang)
			t.Fatalf("only %d of 40 fast orders granted while the slow order's call hangs: they wait for it", i)
		}
	}
	close(hang)
	if r := <-res; r.Key != "slow-1" || r.Outcome != engine.OutcomeProcessed {
		t.Fatalf("slow order: %+v", r)
	}
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

// TestSlowCallsKeepPerKeyOrder checks that under slow calls only one delivery per key
// makes calls. Copies of an order that arrive while the first is making its calls make
// none of their own. They follow it into its batch and are counted as duplicates there.
// They are answered only once the first has committed.
func TestSlowCallsKeepPerKeyOrder(t *testing.T) {
	svc := newSlowService(func(string) time.Duration { return 300 * time.Millisecond })
	p := newPipeline(t, pipelineOpts{conns: 8, svc: svc, plugin: true})
	b, err := p.inbox.NewBatcher(engine.BatchConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	res := submit(t, b, []string{"twice-1", "twice-1", "twice-1"}, 50*time.Millisecond)
	outcomes := map[engine.Outcome]int{}
	for range 3 {
		r := <-res
		outcomes[r.Outcome]++
		if n := svc.callsFor("twice-1"); n != 3 {
			t.Fatalf("a delivery was answered (%s) after %d of the first's 3 calls: before the first committed", r.Outcome, n)
		}
	}
	if outcomes[engine.OutcomeProcessed] != 1 || outcomes[engine.OutcomeDuplicate] != 2 {
		t.Fatalf("outcomes %v, want one processed and two duplicates", outcomes)
	}
	if n := svc.callsFor("twice-1"); n != 3 {
		t.Fatalf("%d calls for the order, want 3 (one per step, none for the duplicates)", n)
	}
	if st := b.Stats(); st.PrepareSkipped != 2 {
		t.Fatalf("stats %+v: want the two duplicates not prepared", st)
	}
	if n := count(t, p.db.DB, "SELECT duplicates FROM inbox WHERE dedup_key = 'twice-1'"); n != 2 {
		t.Fatalf("duplicates counted %d, want 2", n)
	}
}

// claimCounter counts the partitions a subscriber claims, from its "Partition claimed"
// log lines. More claims than partitions mean a rebalance took place.
type claimCounter struct {
	watermill.LoggerAdapter
	claims *atomic.Int64
}

func (c claimCounter) Debug(msg string, fields watermill.LogFields) {
	if msg == "Partition claimed" {
		c.claims.Add(1)
	}
}
func (c claimCounter) With(watermill.LogFields) watermill.LoggerAdapter { return c }

// TestSlowBurstCausesNoRebalance sends a burst of slow orders on the real broker, with the
// shortest session timeout the broker allows. The consumer keeps its partitions, because
// slow calls cause no rebalance. It stops taking messages once the window is full, and
// grants everything. The same counter sees the rebalance a second member causes.
func TestSlowBurstCausesNoRebalance(t *testing.T) {
	kc := testenv.Kafka(t)
	kc.SessionTimeout, kc.RebalanceTimeout, kc.HeartbeatEvery = 6*time.Second, 6*time.Second, time.Second
	const parts, orders = 3, 600
	in := testenv.Topic(t, kc, "order-paid-slow", parts)
	svc := newSlowService(func(order string) time.Duration { // 100–300 ms
		h := fnv.New32a()
		h.Write([]byte(order))
		return 100*time.Millisecond + time.Duration(h.Sum32()%200)*time.Millisecond
	})
	p := newPipeline(t, pipelineOpts{conns: 16, svc: svc, plugin: true, inboxCfg: engine.Config{MaxInFlightCalls: 64}})
	var msgs [][2]string
	for i := range orders {
		id := fmt.Sprintf("burst-%04d", i)
		msgs = append(msgs, [2]string{id, orderJSON(id, "u")})
	}
	produce(t, kc, in, msgs...)

	var claims atomic.Int64
	group := "g-" + in
	start := func() (stop func()) {
		sub, err := kc.NewParallelSubscriber(group, kafkax.ParallelConfig{Window: 64}, claimCounter{LoggerAdapter: watermill.NopLogger{}, claims: &claims})
		if err != nil {
			t.Fatal(err)
		}
		b, err := p.inbox.NewBatcher(engine.BatchConfig{})
		if err != nil {
			t.Fatal(err)
		}
		h := b.HandlerFunc(in)
		return runRouter(t, sub, in, func(m *message.Message) error { return h(m) }, func() { _ = b.Close() })
	}
	start()
	waitFor(t, "every order granted", 120*time.Second, func() (bool, string) {
		n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon")
		return n == orders, fmt.Sprintf("coupons=%d claims=%d calls in flight=%d", n, claims.Load(), svc.inFlight.Load())
	})
	if n := claims.Load(); n != parts {
		t.Fatalf("%d partition claims for %d partitions: slow calls caused a rebalance", n, parts)
	}
	// The counter can fail. A second member joining moves partitions, and the counter sees
	// that.
	start()
	waitFor(t, "the second member's rebalance", 60*time.Second, func() (bool, string) {
		return claims.Load() > parts, fmt.Sprintf("claims=%d", claims.Load())
	})
}

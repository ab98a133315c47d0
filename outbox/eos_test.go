package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// eosConfig is an exactly-once relay config with a fresh transactional id and positions
// topic, so tests running in parallel never fence each other.
func eosConfig(t testing.TB, k kafkax.Config, cfg outbox.RelayConfig) outbox.RelayConfig {
	t.Helper()
	if cfg.TransactionalID == "" {
		cfg.TransactionalID = "test-" + t.Name() + "-" + fmt.Sprint(time.Now().UnixNano())
	}
	if cfg.PositionsTopic == "" {
		cfg.PositionsTopic = testenv.Topic(t, k, "relay-positions", 1)
	}
	if cfg.LeaseTTL == 0 {
		// Long enough that a slow first transaction on a fresh broker cannot outlive the
		// lease on a loaded machine. The coordinator creates __transaction_state then.
		cfg.LeaseTTL = 15 * time.Second
	}
	return cfg
}

func newEOSRelay(t testing.TB, db *sql.DB, k kafkax.Config, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewExactlyOnceRelay(db, k, cfg, &testLogger{t: t})
	if err != nil {
		t.Fatalf("NewExactlyOnceRelay: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestEOSRelayGapLateCommitDeterministic(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-eos-gap", 1)
	relay := newEOSRelay(t, d.DB, k, eosConfig(t, k, outbox.RelayConfig{}))

	a, b, published := gapScenario(t, d.DB, topic, relay)
	if want := []int{1, 0, 1}; fmt.Sprint(published) != fmt.Sprint(want) {
		t.Fatalf("relay published %v per call, want %v (B, nothing while A is open, then A)", published, want)
	}
	if n := pendingRows(t, d.DB); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, []string{a, b})
	if got := recs[0].Headers[outbox.HeaderEventID] + "," + recs[1].Headers[outbox.HeaderEventID]; got != b+","+a {
		t.Fatalf("Kafka order %s, want %s,%s", got, b, a)
	}
	if !relay.ExactlyOnce() || !relay.Owner() || relay.Sessions() != 1 {
		t.Fatalf("exactly-once %v, owner %v, sessions %d; want true, true, 1", relay.ExactlyOnce(), relay.Owner(), relay.Sessions())
	}
}

// TestEOSRelayConcurrentWritersOutOfOrderCommits runs the concurrent out-of-order writers
// of TestRelayConcurrentWritersOutOfOrderCommits against the exactly-once relay, which reads
// without row locks. Nothing is skipped or published twice, and the per-key order holds.
func TestEOSRelayConcurrentWritersOutOfOrderCommits(t *testing.T) {
	t.Parallel()
	const writers, perWriter = 16, 300
	d := testenv.DB(t, writers+8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-eos-stress", 4)
	relay := newEOSRelay(t, d.DB, k, eosConfig(t, k, stressRelayConfig))
	stressWriters(t, d, k, topic, relay, writers, perWriter)
}

func addN(t *testing.T, db *sql.DB, topic, prefix string, n int) []string {
	t.Helper()
	var ids []string
	var evs []outbox.Event
	for i := range n {
		id := fmt.Sprintf("%s-%03d", prefix, i)
		ids = append(ids, id)
		evs = append(evs, outbox.Event{ID: id, Type: "T", Topic: topic, Key: fmt.Sprintf("k%d", i%3), Payload: []byte(id)})
	}
	addCommitted(t, context.Background(), db, newWriter(t), evs...)
	return ids
}

// TestEOSRelayFencedZombieStopsPublishing has relay A publish. A's lease is made to expire,
// as if A had paused. B takes the shard, and its producer fences A's transactional.id. A
// still believes its lease is valid and tries to publish. Kafka refuses, because A is
// fenced. A reports it with Fenced and ErrFenced and stands by. B publishes everything once.
func TestEOSRelayFencedZombieStopsPublishing(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	if runWithoutRace(t) {
		return
	}
	d := testenv.DB(t, 8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-fence", 2)
	cfg := eosConfig(t, k, outbox.RelayConfig{LeaseTTL: 30 * time.Second})
	cfgA, cfgB := cfg, cfg
	cfgA.Owner, cfgB.Owner = "relay-a", "relay-b"
	a, b := newEOSRelay(t, d.DB, k, cfgA), newEOSRelay(t, d.DB, k, cfgB)
	ctx := context.Background()

	ids := addN(t, d.DB, topic, "first", 10)
	if n, err := a.RelayOnce(ctx); n != 10 || err != nil {
		t.Fatalf("A: RelayOnce = %d, %v; want 10", n, err)
	}
	if n, err := b.RelayOnce(ctx); n != 0 || err != nil || b.Owner() {
		t.Fatalf("B while A holds the lease: RelayOnce = %d, %v, owner %v; want 0, nil, false", n, err, b.Owner())
	}
	d.AdminExec(t, "UPDATE relay_lease SET expires_at = CURRENT_TIMESTAMP(6) - INTERVAL '1' SECOND")
	ids = append(ids, addN(t, d.DB, topic, "second", 10)...)
	if n, err := b.RelayOnce(ctx); n != 10 || err != nil || !b.Owner() {
		t.Fatalf("B after A's lease expired: RelayOnce = %d, %v, owner %v; want 10, nil, true", n, err, b.Owner())
	}
	ids = append(ids, addN(t, d.DB, topic, "third", 5)...)
	n, err := a.RelayOnce(ctx)
	if !errors.Is(err, outbox.ErrFenced) || n != 0 {
		t.Fatalf("zombie A: RelayOnce = %d, %v; want 0, ErrFenced", n, err)
	}
	t.Logf("zombie A: %v", err)
	if !a.Fenced() || a.Fencings() != 1 || a.Owner() {
		t.Fatalf("A: fenced %v, fencings %d, owner %v; want true, 1, false", a.Fenced(), a.Fencings(), a.Owner())
	}
	if n, err := a.RelayOnce(ctx); n != 0 || err != nil {
		t.Fatalf("fenced A again: RelayOnce = %d, %v; want 0, nil (standing by)", n, err)
	}
	if n, err := b.RelayOnce(ctx); n != 5 || err != nil {
		t.Fatalf("B: RelayOnce = %d, %v; want 5", n, err)
	}
	if p := pendingRows(t, d.DB); p != 0 {
		t.Fatalf("%d rows unpublished", p)
	}
	assertExactlyOnce(t, readAll(t, k, topic), ids)
}

// outageDialer is the relay's TCP dialer to Kafka. While down, it refuses new connections
// and has cut the open ones, so to the relay the broker is gone. The real broker keeps
// running, so tests in other packages are not disturbed.
type outageDialer struct {
	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func (o *outageDialer) Dial(network, addr string) (net.Conn, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down {
		return nil, fmt.Errorf("dial %s: simulated broker outage: connection refused", addr)
	}
	c, err := (&net.Dialer{Timeout: 3 * time.Second}).Dial(network, addr)
	if err == nil {
		o.conns = append(o.conns, c)
	}
	return c, err
}

func (o *outageDialer) setDown(down bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.down = down
	if down {
		for _, c := range o.conns {
			_ = c.Close()
		}
		o.conns = nil
	}
}

// TestEOSRelayBrokerOutage has the relay lose the broker for OFTEST_OUTAGE, 30s by default,
// while business transactions keep committing. They only insert outbox rows, so they do not
// fail. The relay retries with backoff. After the broker is back, every event is published
// exactly once. The outage is simulated at the relay's TCP dialer.
// TestEOSRelayRealBrokerStopped stops the whole broker.
func TestEOSRelayBrokerOutage(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	if runWithoutRace(t) {
		return
	}
	outage := outageDuration(t)
	d := testenv.DB(t, 12)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-outage", 4)
	dialer := &outageDialer{}
	cfg := eosConfig(t, k, outbox.RelayConfig{BatchSize: 100, PollInterval: 5 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		MaxRetryBackoff: time.Second, TxnTimeout: 10 * time.Second,
		Tune: func(sc *sarama.Config) {
			sc.Net.Proxy.Enable = true
			sc.Net.Proxy.Dialer = dialer
			sc.Net.DialTimeout = 2 * time.Second
			sc.Net.ReadTimeout, sc.Net.WriteTimeout = 5*time.Second, 5*time.Second
		}})
	relay := newEOSRelay(t, d.DB, k, cfg)
	stop := runRelay(t, relay)
	writers := startPacedWriters(t, d.DB, topic, 4, 5*time.Millisecond)

	time.Sleep(time.Second)
	before := relay.Published()
	if before == 0 {
		t.Fatal("relay published nothing before the outage")
	}
	t.Logf("broker outage for %s (relay published %d so far)", outage, before)
	dialer.setDown(true)
	start, committedAtStart := time.Now(), writers.count()
	time.Sleep(outage)
	committed := writers.count() - committedAtStart
	pendingAtEnd := pendingRows(t, d.DB)
	dialer.setDown(false)
	t.Logf("during the outage: %d events committed by business transactions (slowest %s), %d rows pending, %d failed relay attempts",
		committed, writers.slowest().Round(time.Millisecond), pendingAtEnd, relay.Failures())
	if committed == 0 || pendingAtEnd == 0 {
		t.Fatalf("business transactions committed %d events, %d pending: the outage test did not exercise anything", committed, pendingAtEnd)
	}
	// Timing is not asserted, because it belongs in make bench. On a loaded 2-core machine a
	// business transaction can be slow for reasons that have nothing to do with the broker.
	// What must hold is that they kept committing, as checked above.
	recovered := time.Now()
	time.Sleep(time.Second)
	ids := writers.finish(t)
	waitAllPublished(t, d.DB, len(ids), 90*time.Second)
	t.Logf("drained %d events %s after the broker came back (outage began %s earlier)", len(ids),
		time.Since(recovered).Round(time.Millisecond), time.Since(start).Round(time.Second))
	stop()
	// A batch in flight when the broker went away may stay blocked in the producer's own
	// retries until the broker returns. It then fails, or its lease ran out, and is retried.
	if relay.Failures() == 0 {
		t.Error("the relay reported no failed batch across the outage")
	}
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	assertPerKeyOrder(t, d.DB, recs)
}

// TestRelayRetentionCleanup checks that published rows older than the retention are
// deleted in small batches. Recent and unpublished rows stay.
func TestRelayRetentionCleanup(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	relay := newRelay(t, d.DB, &fakeProducer{}, outbox.RelayConfig{Retention: time.Hour, CleanupBatch: 2})
	addN(t, d.DB, "t", "old", 5)
	if n, err := relay.RelayOnce(ctx); n != 5 || err != nil {
		t.Fatalf("RelayOnce = %d, %v", n, err)
	}
	addN(t, d.DB, "t", "pending", 2)
	d.AdminExec(t, "UPDATE outbox SET published_at = CURRENT_TIMESTAMP(6) - INTERVAL '2' HOUR WHERE event_id IN ('old-000','old-001','old-002','old-003')")
	n, err := relay.Cleanup(ctx)
	if err != nil || n != 4 || relay.Deleted() != 4 {
		t.Fatalf("Cleanup = %d, %v (total %d); want 4", n, err, relay.Deleted())
	}
	if got := countRows(t, d.DB, "1=1"); got != 3 {
		t.Fatalf("%d rows left, want 3 (one recent published, two pending)", got)
	}
	if got := pendingRows(t, d.DB); got != 2 {
		t.Fatalf("%d pending rows left, want 2", got)
	}
}

// TestEOSRelayPipelinedMarks checks the pipelined marks of Run. There a batch's database
// mark runs while the next batch is read and sent. The marks are slowed down to 50ms each,
// so the next batch is always read while the previous one is still unmarked. The read must
// leave those rows out, or Kafka would get them twice. The next batch must not commit in
// Kafka before the previous mark is done. Otherwise two committed batches could be unmarked
// after a crash, and reconciliation covers only the last one. The check at each Kafka
// commit is exact. The rows marked so far are those of every earlier batch.
func TestEOSRelayPipelinedMarks(t *testing.T) {
	t.Parallel()
	const rows, batch = 120, 10
	d := testenv.DB(t, 8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-eos-pipelined", 3)
	ids := addN(t, d.DB, topic, "pipe", rows)

	var (
		mu        sync.Mutex
		committed int // rows in batches committed to Kafka
		problems  []string
	)
	cfg := eosConfig(t, k, outbox.RelayConfig{BatchSize: batch})
	cfg.Hook = func(point string) {
		switch point {
		case "before-kafka-commit":
			mu.Lock()
			want := committed
			mu.Unlock()
			var got int
			err := d.DB.QueryRow("SELECT COUNT(*) FROM outbox WHERE published_at IS NOT NULL").Scan(&got)
			if err != nil || got != want {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("a batch commits with %d rows marked (%v), want %d (every earlier batch)", got, err, want))
				mu.Unlock()
			}
		case "after-kafka-commit":
			mu.Lock()
			committed += batch
			mu.Unlock()
		case "before-mark":
			time.Sleep(50 * time.Millisecond)
		}
	}
	relay := newEOSRelay(t, d.DB, k, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = relay.Run(ctx) }()
	waitAllPublished(t, d.DB, rows, time.Minute)
	cancel()
	<-done

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	if committed != rows || relay.Published() != rows || relay.Batches() != rows/batch {
		t.Errorf("committed %d rows, published %d in %d batches; want %d in %d", committed, relay.Published(), relay.Batches(), rows, rows/batch)
	}
	assertExactlyOnce(t, readAll(t, k, topic), ids)
}

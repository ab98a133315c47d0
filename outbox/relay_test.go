package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// ---------------------------------------------------------------------------------------
// Gap safety, made deterministic. A row with a lower id commits after a row with a higher
// id.

// naiveRelay is the classic high-water-mark relay. It remembers the largest id it has
// published and only looks above it. It exists to show that the gap test can fail.
type naiveRelay struct {
	db       *sql.DB
	producer sarama.SyncProducer
	lastSeen int64
}

func (r *naiveRelay) RelayOnce(ctx context.Context) (int, error) {
	rows, err := r.db.QueryContext(ctx,
		rebind(r.db, "SELECT id, event_id, event_type, topic, msg_key, payload FROM outbox WHERE id > ? ORDER BY id LIMIT 500"), r.lastSeen)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var (
		msgs  []*sarama.ProducerMessage
		maxID = r.lastSeen
	)
	for rows.Next() {
		var (
			id                       int64
			eventID, typ, topic, key string
			payload                  []byte
		)
		if err := rows.Scan(&id, &eventID, &typ, &topic, &key, &payload); err != nil {
			return 0, err
		}
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(payload),
			Headers: []sarama.RecordHeader{{Key: []byte(outbox.HeaderEventID), Value: []byte(eventID)}, {Key: []byte(outbox.HeaderEventType), Value: []byte(typ)}}})
		maxID = max(maxID, id)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	if err := r.producer.SendMessages(msgs); err != nil {
		return 0, err
	}
	r.lastSeen = maxID
	return len(msgs), nil
}

type relayOncer interface {
	RelayOnce(ctx context.Context) (int, error)
}

// gapScenario lets tx A insert first, with the lower id, and stay open while tx B inserts
// and commits. The relay runs, A commits, and the relay runs again. gapScenario returns the
// two event ids and what each relay call reported.
func gapScenario(t *testing.T, db *sql.DB, topic string, r relayOncer) (a, b string, published []int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := newWriter(t)
	evA := outbox.Event{ID: "event-A", Type: "Gap", Topic: topic, Key: "k", Payload: []byte("A")}
	evB := outbox.Event{ID: "event-B", Type: "Gap", Topic: topic, Key: "k", Payload: []byte("B")}

	txA, err := db.BeginTx(ctx, dbx.TxOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = txA.Rollback() }()
	if err := w.Add(ctx, txA, evA); err != nil {
		t.Fatal(err)
	}
	var idA, idB int64
	if err := txA.QueryRowContext(ctx, rebind(db, "SELECT id FROM outbox WHERE event_id = ?"), evA.ID).Scan(&idA); err != nil {
		t.Fatal(err)
	}
	addCommitted(t, ctx, db, w, evB)
	if err := db.QueryRowContext(ctx, rebind(db, "SELECT id FROM outbox WHERE event_id = ?"), evB.ID).Scan(&idB); err != nil {
		t.Fatal(err)
	}
	if idA >= idB {
		t.Fatalf("scenario broken: A got id %d, B got id %d; A must have the lower id", idA, idB)
	}
	t.Logf("A: id %d (open), B: id %d (committed)", idA, idB)

	relayOnce := func(step string) {
		// The context is bounded, because a relay that waited for A's row lock would hang here.
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		n, err := r.RelayOnce(cctx)
		if err != nil {
			t.Fatalf("relay %s: %v", step, err)
		}
		t.Logf("relay %s: published %d", step, n)
		published = append(published, n)
	}
	relayOnce("while A is open")
	relayOnce("again while A is open")
	if err := txA.Commit(); err != nil {
		t.Fatalf("commit A: %v", err)
	}
	relayOnce("after A committed")
	return evA.ID, evB.ID, published
}

func TestRelayGapLateCommitDeterministic(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-gap", 1)
	relay := newRelay(t, d.DB, newProducer(t, k), outbox.RelayConfig{})

	a, b, published := gapScenario(t, d.DB, topic, relay)
	if want := []int{1, 0, 1}; fmt.Sprint(published) != fmt.Sprint(want) {
		t.Fatalf("relay published %v per call, want %v (B, nothing while A is open, then A)", published, want)
	}
	if n := pendingRows(t, d.DB); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, []string{a, b})
	// With one partition, Kafka order is publish order. B committed first, so B comes before
	// A.
	if got := recs[0].Headers[outbox.HeaderEventID] + "," + recs[1].Headers[outbox.HeaderEventID]; got != b+","+a {
		t.Fatalf("Kafka order %s, want %s,%s", got, b, a)
	}
}

// TestNaiveHighWaterMarkRelaySkipsLateCommit runs the same scenario with a high-water-mark
// relay to show that the check above detects a lost event.
func TestNaiveHighWaterMarkRelaySkipsLateCommit(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-naive", 1)
	naive := &naiveRelay{db: d.DB, producer: newProducer(t, k)}

	a, b, published := gapScenario(t, d.DB, topic, naive)
	if want := []int{1, 0, 0}; fmt.Sprint(published) != fmt.Sprint(want) {
		t.Fatalf("naive relay published %v per call, want %v", published, want)
	}
	problems := exactlyOnceProblems(readAll(t, k, topic), []string{a, b})
	if fmt.Sprint(problems) != fmt.Sprint([]string{"missing " + a}) {
		t.Fatalf("the naive relay should lose exactly %s, the exactly-once check reports %v", a, problems)
	}
	t.Logf("as expected, the exactly-once check catches the high-water-mark relay: %v", problems)
}

// ---------------------------------------------------------------------------------------
// Gap safety and per-key order under concurrency.

type seqPayload struct {
	Writer int    `json:"w"`
	Key    string `json:"key"`
	Seq    int    `json:"seq"`
}

// runWriters starts writers goroutines that each add perWriter events in transactions of
// 1..3 events. Each transaction sleeps 0..5ms before it commits, so commit order differs
// from id order. Writer w owns the keys w<w>-k0 and w<w>-k1 and numbers each key's events.
// runWriters returns the event ids once every writer is done.
func runWriters(t *testing.T, ctx context.Context, db *sql.DB, topic string, writers, perWriter int) []string {
	t.Helper()
	w := newWriter(t)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ids      []string
		retries  int
		failures int
	)
	for wr := range writers {
		wg.Go(func() {
			seq := map[string]int{}
			for i := 0; i < perWriter; {
				n := min(1+rand.IntN(3), perWriter-i)
				var evs []outbox.Event
				for j := range n {
					key := fmt.Sprintf("w%02d-k%d", wr, rand.IntN(2))
					seq[key]++
					p, _ := json.Marshal(seqPayload{Writer: wr, Key: key, Seq: seq[key]})
					evs = append(evs, outbox.Event{ID: fmt.Sprintf("w%02d-e%05d", wr, i+j), Type: "Stress", Topic: topic, Key: key, Payload: p})
				}
				for attempt := 0; ; attempt++ {
					err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
						for _, e := range evs {
							if err := w.Add(ctx, tx, e); err != nil {
								return err
							}
						}
						time.Sleep(time.Duration(rand.IntN(5001)) * time.Microsecond)
						return nil
					})
					if err == nil {
						break
					}
					if dbx.IsLockConflict(err) && attempt < 5 {
						mu.Lock()
						retries++
						mu.Unlock()
						continue
					}
					mu.Lock()
					failures++
					mu.Unlock()
					t.Errorf("writer %d: %v", wr, err)
					return
				}
				mu.Lock()
				for _, e := range evs {
					ids = append(ids, e.ID)
				}
				mu.Unlock()
				i += n
			}
		})
	}
	wg.Wait()
	if retries > 0 {
		t.Logf("writers retried %d transactions after lock conflicts", retries)
	}
	if failures > 0 {
		t.FailNow()
	}
	return ids
}

// runRelay runs r.Run in a goroutine. The returned stop cancels it and waits for it.
func runRelay(t *testing.T, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("relay Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("relay Run did not return 30s after cancel")
		}
	}
	t.Cleanup(stop)
	return stop
}

// lateRows counts rows that were published after some row with a higher id. A
// high-water-mark relay would have skipped them.
func lateRows(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	err := db.QueryRow(`SELECT COUNT(*) FROM (SELECT published_at,
 MIN(published_at) OVER (ORDER BY id ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS later_min
 FROM outbox) x WHERE published_at > later_min`).Scan(&n)
	if err != nil {
		t.Fatalf("late rows: %v", err)
	}
	return n
}

func TestRelayConcurrentWritersOutOfOrderCommits(t *testing.T) {
	const writers, perWriter = 16, 300
	d := testenv.DB(t, writers+8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-stress", 4)
	relay := newRelay(t, d.DB, newProducer(t, k), stressRelayConfig)
	stressWriters(t, d, k, topic, relay, writers, perWriter)
}

// stressRelayConfig polls fast so the relay races the writers' late commits.
var stressRelayConfig = outbox.RelayConfig{BatchSize: 100, PollInterval: 2 * time.Millisecond, RetryBackoff: 100 * time.Millisecond}

// stressWriters runs relay while writers commit out of id order, then checks that every
// event reached Kafka exactly once and each key's events in commit order.
func stressWriters(t *testing.T, d testenv.Database, k kafkax.Config, topic string, relay *outbox.Relay, writers, perWriter int) {
	t.Helper()
	stop := runRelay(t, relay)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ids := runWriters(t, ctx, d.DB, topic, writers, perWriter)
	waitAllPublished(t, d.DB, len(ids), 60*time.Second)
	stop()
	if got := relay.Published(); got != int64(len(ids)) {
		t.Errorf("relay counted %d published events, want %d", got, len(ids))
	}
	t.Logf("%d events; %d rows were committed and published after a row with a higher id", len(ids), lateRows(t, d.DB))
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	assertPerKeyOrder(t, d.DB, recs)
}

// assertPerKeyOrder checks that each key's events are on one partition with increasing
// sequence numbers. One writer owns each key, so its rows commit in sequence order.
func assertPerKeyOrder(t *testing.T, db *sql.DB, recs []kafkax.Record) {
	t.Helper()
	type state struct {
		partition int32
		seq       int
		eventID   string
		offset    int64
	}
	describe := func(eventID string, offset int64) string {
		var (
			id        int64
			created   time.Time
			published sql.NullTime
		)
		if err := db.QueryRow(rebind(db, "SELECT id, created_at, published_at FROM outbox WHERE event_id = ?"), eventID).Scan(&id, &created, &published); err != nil {
			return fmt.Sprintf("%s (offset %d): %v", eventID, offset, err)
		}
		return fmt.Sprintf("%s (offset %d, row id %d, created %s, published %s)", eventID, offset, id,
			created.Format("15:04:05.000000"), published.Time.Format("15:04:05.000000"))
	}
	last := map[string]*state{}
	bad := 0
	for _, r := range recs { // ReadAll returns each partition in offset order
		var p seqPayload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatalf("record %d/%d: payload %q: %v", r.Partition, r.Offset, r.Value, err)
		}
		if p.Key != r.Key {
			t.Fatalf("record %d/%d: Kafka key %q, payload key %q", r.Partition, r.Offset, r.Key, p.Key)
		}
		s := last[r.Key]
		switch {
		case s == nil:
			if p.Seq != 1 {
				t.Errorf("key %s: first record on Kafka has seq %d, want 1", r.Key, p.Seq)
				bad++
			}
			last[r.Key] = &state{r.Partition, p.Seq, r.Headers[outbox.HeaderEventID], r.Offset}
			continue
		case s.partition != r.Partition:
			t.Errorf("key %s on partitions %d and %d", r.Key, s.partition, r.Partition)
			bad++
		case p.Seq != s.seq+1:
			t.Errorf("key %s: seq %d follows seq %d on Kafka (partition %d):\n  %s\n  then %s", r.Key, p.Seq, s.seq, r.Partition,
				describe(s.eventID, s.offset), describe(r.Headers[outbox.HeaderEventID], r.Offset))
			bad++
		}
		s.seq, s.eventID, s.offset = p.Seq, r.Headers[outbox.HeaderEventID], r.Offset
		if bad > 20 {
			t.FailNow()
		}
	}
	t.Logf("%d keys, each in sequence order on one partition", len(last))
}

// ---------------------------------------------------------------------------------------
// Two relays over one table. FOR UPDATE SKIP LOCKED must keep them from publishing a row
// twice.

func TestTwoRelaysSkipLockedNoDuplicates(t *testing.T) {
	const writers, perWriter = 8, 250
	d := testenv.DB(t, writers+8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-two-relays", 4)
	cfg := outbox.RelayConfig{BatchSize: 20, PollInterval: 2 * time.Millisecond, RetryBackoff: 100 * time.Millisecond}
	r1 := newRelay(t, d.DB, newProducer(t, k), cfg)
	r2 := newRelay(t, d.DB, newProducer(t, k), cfg)
	stop1, stop2 := runRelay(t, r1), runRelay(t, r2)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ids := runWriters(t, ctx, d.DB, topic, writers, perWriter)
	waitAllPublished(t, d.DB, len(ids), 60*time.Second)
	stop1()
	stop2()

	p1, p2 := r1.Published(), r2.Published()
	t.Logf("relay 1 published %d, relay 2 published %d of %d events", p1, p2, len(ids))
	if p1 == 0 || p2 == 0 {
		t.Logf("note: one relay published everything (acceptable, distribution is up to the scheduler)")
	}
	if p1+p2 != int64(len(ids)) {
		t.Errorf("relays counted %d+%d published events, want %d in total", p1, p2, len(ids))
	}
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	// A relay holds back a key whose earlier row the other relay has locked, so per-key
	// order survives two relays as well.
	assertPerKeyOrder(t, d.DB, recs)
}

// TestRelayHoldsBackKeyBehindLockedRow checks that a pending row that someone else locked,
// such as another relay, is skipped. So is every later row of its key. Other keys go ahead.
func TestRelayHoldsBackKeyBehindLockedRow(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev := func(id, key string) outbox.Event {
		return outbox.Event{ID: id, Type: "T", Topic: "t", Key: key, Payload: []byte(id)}
	}
	addCommitted(t, ctx, d.DB, newWriter(t), ev("k1-1", "k1"), ev("k2-1", "k2"), ev("k1-2", "k1"), ev("k2-2", "k2"))

	other, err := d.DB.BeginTx(ctx, dbx.TxOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback() }()
	var id int64
	if err := other.QueryRowContext(ctx, "SELECT id FROM outbox WHERE event_id = 'k1-1' FOR UPDATE").Scan(&id); err != nil {
		t.Fatal(err)
	}

	p := &fakeProducer{}
	relay := newRelay(t, d.DB, p, outbox.RelayConfig{})
	if n, err := relay.RelayOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RelayOnce with k1-1 locked elsewhere = %d, %v; want 2 (k2 only)", n, err)
	}
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RelayOnce after the lock is gone = %d, %v; want 2 (k1-1, k1-2)", n, err)
	}
	_, sent := p.snapshot()
	var got []string
	for _, m := range sent {
		got = append(got, headerValue(m, outbox.HeaderEventID))
	}
	if want := "[k2-1 k2-2 k1-1 k1-2]"; fmt.Sprint(got) != want {
		t.Fatalf("sent %v, want %s", got, want)
	}
}

// ---------------------------------------------------------------------------------------
// Error path. A failed publish rolls back, nothing is marked, and the next call succeeds.

func TestRelayPublishFailureRollsBack(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	w := newWriter(t)
	var evs []outbox.Event
	for i := range 3 {
		evs = append(evs, outbox.Event{ID: fmt.Sprintf("fail-%d", i), Type: "T", Topic: "t", Key: "k", Payload: []byte{byte(i)}})
	}
	addCommitted(t, ctx, d.DB, w, evs...)

	p := &fakeProducer{failOn: map[int]bool{1: true}}
	relay := newRelay(t, d.DB, p, outbox.RelayConfig{})
	n, err := relay.RelayOnce(ctx)
	if err == nil {
		t.Fatalf("RelayOnce with a failing producer: published %d, want an error", n)
	}
	t.Logf("first RelayOnce: %v", err)
	if n != 0 || relay.Published() != 0 {
		t.Fatalf("failed RelayOnce reported %d (total %d), want 0", n, relay.Published())
	}
	if got := pendingRows(t, d.DB); got != 3 {
		t.Fatalf("%d rows unpublished after a failed publish, want 3 (rolled back)", got)
	}
	// The failed transaction released its row locks, so another transaction can claim them.
	lockCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = dbx.InTx(lockCtx, d.DB, func(tx *sql.Tx) error {
		var c int
		if err := tx.QueryRowContext(lockCtx, "SELECT COUNT(*) FROM (SELECT id FROM outbox WHERE published_at IS NULL FOR UPDATE SKIP LOCKED) x").Scan(&c); err != nil {
			return err
		}
		if c != 3 {
			return fmt.Errorf("%d rows claimable, want 3 (locks still held?)", c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	n, err = relay.RelayOnce(ctx)
	if err != nil || n != 3 {
		t.Fatalf("second RelayOnce = %d, %v; want 3, nil", n, err)
	}
	if got := pendingRows(t, d.DB); got != 0 {
		t.Fatalf("%d rows unpublished after a successful publish", got)
	}
	calls, sent := p.snapshot()
	if calls != 2 || len(sent) != 3 {
		t.Fatalf("producer: %d calls, %d messages sent; want 2 calls, 3 messages", calls, len(sent))
	}
	for i, m := range sent { // id order
		if got := headerValue(m, outbox.HeaderEventID); got != evs[i].ID {
			t.Fatalf("message %d is %s, want %s", i, got, evs[i].ID)
		}
	}
	if n, err := relay.RelayOnce(ctx); err != nil || n != 0 {
		t.Fatalf("third RelayOnce = %d, %v; want 0, nil (nothing left)", n, err)
	}
}

func TestRelayRunRetriesAfterFailure(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	addCommitted(t, ctx, d.DB, newWriter(t), outbox.Event{ID: "retry-1", Type: "T", Topic: "t", Key: "k", Payload: []byte("x")})
	p := &fakeProducer{failOn: map[int]bool{1: true, 2: true}}
	log := &testLogger{t: t}
	relay, err := outbox.NewRelay(d.DB, p, outbox.RelayConfig{PollInterval: 5 * time.Millisecond, RetryBackoff: 10 * time.Millisecond}, log)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, relay)
	waitAllPublished(t, d.DB, 1, 30*time.Second)
	stop()
	calls, sent := p.snapshot()
	if calls < 3 || len(sent) != 1 || relay.Published() != 1 {
		t.Fatalf("producer calls %d, sent %d, relay published %d; want >=3 calls, 1 message, 1 published", calls, len(sent), relay.Published())
	}
	if log.Errors() < 2 {
		t.Fatalf("relay logged %d errors, want one per failed publish (2)", log.Errors())
	}
}

// ---------------------------------------------------------------------------------------
// Headers, key and value on the real broker.

func TestRelayHeadersKeyAndValue(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-headers", 3)
	ctx := context.Background()
	evs := []outbox.Event{
		{ID: "11111111-1111-4111-8111-111111111111", Type: "CouponGranted", Topic: topic, Key: "order-1", Payload: []byte(`{"a":1}`),
			Headers: map[string]string{"trace_id": "trace-1", "tenant": "acme", "empty": ""}},
		{ID: "22222222-2222-4222-8222-222222222222", Type: "CouponGrantFailed", Topic: topic, Key: "order-2", Payload: []byte(`{"b":2}`)},
		{ID: "h-3", Type: "CouponGranted", Topic: topic, Key: "order-1", Payload: []byte("third"), Headers: map[string]string{"x-ü": "wert ü"}},
		{ID: "h-4", Type: "Empty", Topic: topic, Key: "order-3", Payload: nil},
	}
	addCommitted(t, ctx, d.DB, newWriter(t), evs...)
	relay := newRelay(t, d.DB, newProducer(t, k), outbox.RelayConfig{})
	if n, err := relay.RelayOnce(ctx); err != nil || n != len(evs) {
		t.Fatalf("RelayOnce = %d, %v; want %d", n, err, len(evs))
	}
	if age, err := relay.OldestPendingAge(ctx); err != nil || age != 0 {
		t.Fatalf("OldestPendingAge = %s, %v; want 0 with nothing pending", age, err)
	}

	recs := readAll(t, k, topic)
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.ID
	}
	assertExactlyOnce(t, recs, ids)
	partitionOfKey := map[string]int32{}
	for _, r := range recs {
		var e outbox.Event
		for _, c := range evs {
			if c.ID == r.Headers[outbox.HeaderEventID] {
				e = c
			}
		}
		want := map[string]string{outbox.HeaderEventID: e.ID, outbox.HeaderEventType: e.Type}
		maps.Copy(want, e.Headers)
		if !maps.Equal(r.Headers, want) {
			t.Errorf("event %s: headers %v, want %v", e.ID, r.Headers, want)
		}
		if r.Key != e.Key {
			t.Errorf("event %s: Kafka key %q, want %q", e.ID, r.Key, e.Key)
		}
		if !bytes.Equal(r.Value, e.Payload) {
			t.Errorf("event %s: value %q, want %q", e.ID, r.Value, e.Payload)
		}
		if p, ok := partitionOfKey[r.Key]; ok && p != r.Partition {
			t.Errorf("key %s on partitions %d and %d", r.Key, p, r.Partition)
		}
		partitionOfKey[r.Key] = r.Partition
	}
}

func TestRelayOldestPendingAge(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	relay := newRelay(t, d.DB, &fakeProducer{}, outbox.RelayConfig{})
	if age, err := relay.OldestPendingAge(ctx); err != nil || age != 0 {
		t.Fatalf("empty outbox: OldestPendingAge = %s, %v; want 0", age, err)
	}
	addCommitted(t, ctx, d.DB, newWriter(t), outbox.Event{ID: "age-1", Type: "T", Topic: "t", Key: "k", Payload: []byte("x")})
	if _, err := relay.OldestPendingAge(ctx); err != nil {
		t.Fatalf("OldestPendingAge with a pending row: %v", err)
	}
	if _, err := relay.RelayOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if age, err := relay.OldestPendingAge(ctx); err != nil || age != 0 {
		t.Fatalf("after publishing: OldestPendingAge = %s, %v; want 0", age, err)
	}
}

// TestRelayBatchBytes checks that both relays bound a batch by the bytes of its events as
// well as by their count: with relay.batch_bytes at 100 KiB, 20 events of 40 KiB go out
// three per batch (the third reaches the bound), each once.
func TestRelayBatchBytes(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	ctx := context.Background()
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly_once=%v", exactlyOnce), func(t *testing.T) {
			topic := testenv.Topic(t, k, "outbox-batch-bytes", 3)
			evs := make([]outbox.Event, 20)
			ids := make([]string, len(evs))
			for i := range evs {
				ids[i] = fmt.Sprintf("batch-bytes-%v-%02d", exactlyOnce, i)
				evs[i] = outbox.Event{ID: ids[i], Type: "Big", Topic: topic, Key: fmt.Sprintf("k%d", i%4), Payload: bytes.Repeat([]byte{'x'}, 40<<10)}
			}
			addCommitted(t, ctx, d.DB, newWriter(t), evs...)
			cfg := outbox.RelayConfig{BatchBytes: 100 << 10, Linger: outbox.NoLinger}
			var relay *outbox.Relay
			if exactlyOnce {
				relay = newEOSRelay(t, d.DB, k, eosConfig(t, k, cfg))
			} else {
				relay = newRelay(t, d.DB, newProducer(t, k), cfg)
			}
			var sizes []int
			for total := 0; total < len(evs) && len(sizes) < 2*len(evs); {
				n, err := relay.RelayOnce(ctx)
				if err != nil {
					t.Fatalf("RelayOnce: %v", err)
				}
				total += n
				sizes = append(sizes, n)
			}
			if want := []int{3, 3, 3, 3, 3, 3, 2}; fmt.Sprint(sizes) != fmt.Sprint(want) {
				t.Errorf("batches of %v events, want %v", sizes, want)
			}
			if n := pendingRows(t, d.DB); n != 0 {
				t.Errorf("%d rows unpublished", n)
			}
			assertExactlyOnce(t, readAll(t, k, topic), ids)
		})
	}
}

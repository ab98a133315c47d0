package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// parkedLines counts the relay's log lines about parked events, and forwards every line to
// the test log.
type parkedLines struct {
	testLogger
	parked atomic.Int64 // error lines saying PARKED
}

func (l *parkedLines) Error(msg string, err error, fields watermill.LogFields) {
	if strings.Contains(msg, "PARKED") {
		l.parked.Add(1)
	}
	l.testLogger.Error(msg, err, fields)
}

func (l *parkedLines) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// TestRetrySelectedWhileRelaying parks the events of 300 keys of a topic that does not
// exist, 300 refused and the rest held behind them, while writers keep adding events of
// those keys. The relay logs the refusals in a few summary lines, not one per event, and
// counts every parked event by its reason. The topic appears and RetrySelected releases the
// refused events by topic, many batches of few events, while the writers and the relay go
// on. Every event of every key then reaches the topic once, in the key's order.
func TestRetrySelectedWhileRelaying(t *testing.T) {
	d := testenv.DB(t, 8)
	k := testenv.Kafka(t)
	topic := uniqueName("bulk-missing")
	logger := &parkedLines{testLogger: testLogger{t: t}}
	relay, err := outbox.NewExactlyOnceRelay(d.DB, k, eosConfig(t, k, outbox.RelayConfig{BatchSize: 500, PollInterval: 5 * time.Millisecond}), logger)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, relay)
	defer stop()

	const keys = 300
	w := newWriter(t)
	var (
		mu      sync.Mutex
		seq     = map[string]int{}
		written int
	)
	round := func() {
		t.Helper()
		evs := make([]outbox.Event, 0, keys)
		mu.Lock()
		for i := range keys {
			key := fmt.Sprintf("k-%03d", i)
			seq[key]++
			p, _ := json.Marshal(seqPayload{Key: key, Seq: seq[key]})
			evs = append(evs, outbox.Event{ID: fmt.Sprintf("%s-%04d", key, seq[key]), Type: "T", Topic: topic, Key: key, Payload: p})
		}
		written += len(evs)
		mu.Unlock()
		// A writer runs its transaction again after a lock conflict, as the router's
		// handlers do. The bulk retry's moves may deadlock with its inserts.
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			err = dbx.InTx(context.Background(), d.DB, func(tx *sql.Tx) error { return w.AddBatch(context.Background(), tx, evs) })
			if !dbx.IsLockConflict(err) {
				break
			}
		}
		if err != nil {
			t.Errorf("write a round: %v", err)
		}
	}
	for range 10 {
		round()
	}
	waitSettled(t, d.DB, 10*keys, 2*time.Minute)
	// The relay counts what it parked just after the database has it, the total first and
	// then each reason: wait for the counts to catch up with the rows before reading them.
	counted := func() int64 {
		var n int64
		for _, c := range relay.ParkedBy() {
			n += c
		}
		return min(n, relay.Parked())
	}
	for deadline := time.Now().Add(10 * time.Second); counted() < 10*keys && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	by := relay.ParkedBy()
	if by[outbox.ReasonUnknownTopic] != keys || by[outbox.ReasonHeld] != 9*keys || relay.Parked() != 10*keys {
		t.Errorf("parked by reason %v (total %d), want %d unknown_topic and %d held", by, relay.Parked(), keys, 9*keys)
	}
	if n := logger.parked.Load(); n > 3 {
		t.Errorf("%d PARKED lines for %d refused events, want a few summary lines", n, keys)
	}

	createTopic(t, k, topic, 3, nil)
	store, err := outbox.NewParked(d.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	restore := outbox.SetBulkBatch(25)
	defer restore()
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for range 10 {
			round()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var calls int
	rel, err := store.RetrySelected(context.Background(), outbox.Selection{Topic: topic}, func(outbox.BulkRelease) { calls++ })
	<-writing
	if err != nil {
		t.Fatalf("RetrySelected: %v (after %+v)", err, rel)
	}
	t.Logf("RetrySelected: %+v, %d progress calls", rel, calls)
	if rel.Released == 0 || rel.Batches < keys/25 || calls != rel.Batches || rel.Moved < rel.Released {
		t.Errorf("RetrySelected = %+v with %d progress calls, want at least %d batches of 25 refused events", rel, calls, keys/25)
	}
	// Events the relay parked after the retry began, behind a refusal of a batch it read
	// before the topic appeared, are retried too.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if _, err := store.RetrySelected(context.Background(), outbox.Selection{Topic: topic}, nil); err != nil {
			t.Fatal(err)
		}
		if pendingRows(t, d.DB) == 0 && parkedCount(t, d.DB) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows pending, %d parked 2 minutes after the retry", pendingRows(t, d.DB), parkedCount(t, d.DB))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()

	recs := readAll(t, k, topic)
	if len(recs) != written {
		t.Errorf("%d records on the topic, want the %d written", len(recs), written)
	}
	last := map[string]int{}
	for _, r := range recs {
		var p seqPayload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatal(err)
		}
		if p.Seq != last[p.Key]+1 {
			t.Fatalf("key %s: event %d after %d, want %d: the key's order broke", p.Key, p.Seq, last[p.Key], last[p.Key]+1)
		}
		last[p.Key] = p.Seq
	}
	for key, n := range seq {
		if last[key] != n {
			t.Errorf("key %s: %d events on the topic, want %d", key, last[key], n)
		}
	}
}

// DropSelected deletes the refused events it chooses and puts the events held behind them
// back into the outbox with their ids; RetrySelected puts the rest back. Choose counts both
// and lists the first. A held reason chooses nothing.
func TestDropSelected(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	ins := testenv.Rebind(`INSERT INTO outbox_parked (id, event_id, event_type, topic, msg_key, payload, created_at, reason, error, held_behind)
 VALUES (?, ?, 'T', ?, ?, ?, CURRENT_TIMESTAMP(6), ?, 'refused', ?)`)
	add := func(id int, topic, key, reason string, behind any) {
		t.Helper()
		if _, err := d.DB.Exec(ins, id, fmt.Sprintf("ev-%d", id), topic, key, []byte("x"), reason, behind); err != nil {
			t.Fatal(err)
		}
	}
	// Keys a0..a9 of topic a are refused as unknown, each with two held events; keys b0..b4
	// as too large, each with one.
	for i := range 10 {
		add(100+i, "a", fmt.Sprintf("a%d", i), outbox.ReasonUnknownTopic, nil)
		add(200+2*i, "a", fmt.Sprintf("a%d", i), outbox.ReasonHeld, fmt.Sprintf("ev-%d", 100+i))
		add(201+2*i, "other", fmt.Sprintf("a%d", i), outbox.ReasonHeld, fmt.Sprintf("ev-%d", 100+i))
	}
	for i := range 5 {
		add(300+i, "b", fmt.Sprintf("b%d", i), outbox.ReasonTooLarge, nil)
		add(400+i, "b", fmt.Sprintf("b%d", i), outbox.ReasonHeld, fmt.Sprintf("ev-%d", 300+i))
	}
	store, err := outbox.NewParked(d.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.DropSelected(ctx, outbox.Selection{Reason: outbox.ReasonHeld}, nil); !errors.Is(err, outbox.ErrBadRef) {
		t.Errorf("DropSelected of reason held: %v, want ErrBadRef", err)
	}
	c, err := store.Choose(ctx, outbox.Selection{Reason: outbox.ReasonTooLarge}, 2)
	if err != nil || c.Refused != 5 || c.Held != 5 || len(c.First) != 2 || c.First[0].EventID != "ev-300" || c.First[0].Holding != 1 {
		t.Fatalf("Choose(too_large) = %+v, %v; want 5 refused, 5 held, the first two listed", c, err)
	}
	restore := outbox.SetBulkBatch(2)
	defer restore()
	rel, err := store.DropSelected(ctx, outbox.Selection{Reason: outbox.ReasonTooLarge}, nil)
	if err != nil || rel.Released != 5 || rel.Moved != 5 || rel.Batches != 3 {
		t.Fatalf("DropSelected = %+v, %v; want 5 dropped, 5 moved back, in 3 batches", rel, err)
	}
	if n := countRows(t, d.DB, "id BETWEEN 400 AND 404 AND published_at IS NULL"); n != 5 {
		t.Errorf("%d of the 5 held events are back in the outbox with their ids", n)
	}
	if n := countRows(t, d.DB, "id BETWEEN 300 AND 304"); n != 0 {
		t.Errorf("%d dropped events are in the outbox", n)
	}
	c, err = store.Choose(ctx, outbox.Selection{}, 0)
	if err != nil || c.Refused != 10 || c.Held != 20 || c.First != nil {
		t.Fatalf("Choose(all) = %+v, %v; want 10 refused, 20 held", c, err)
	}
	rel, err = store.RetrySelected(ctx, outbox.Selection{Topic: "a"}, nil)
	if err != nil || rel.Released != 10 || rel.Moved != 30 {
		t.Fatalf("RetrySelected(topic a) = %+v, %v; want 10 retried, 30 back in the outbox", rel, err)
	}
	var ids []int64
	rows, err := d.DB.Query("SELECT id FROM outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	var want []int64
	for i := range 10 {
		want = append(want, int64(100+i), int64(200+2*i), int64(201+2*i))
	}
	for i := range 5 {
		want = append(want, int64(400+i))
	}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("outbox ids %v, want %v", ids, want)
	}
	if n := parkedCount(t, d.DB); n != 0 {
		t.Errorf("%d events still parked", n)
	}
}

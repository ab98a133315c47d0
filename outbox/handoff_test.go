package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/internal/txdefer"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// handOffEvents are events whose rows a read turns into messages in every way it can. They
// hold invalid UTF-8, which is never rewritten, an empty and a 200 KB payload, extra
// headers with quotes and a traceparent, and many keys.
func handOffEvents(topic, prefix string) []outbox.Event {
	var evs []outbox.Event
	for i := range 40 {
		e := outbox.Event{ID: fmt.Sprintf("%s-%02d", prefix, i), Type: "Handed", Topic: topic,
			Key: fmt.Sprintf("key-%d", i%7), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		switch i % 5 {
		case 1:
			e.Payload = []byte{'\xff', '\xfe', 'o', 'k', 0}
		case 2:
			e.Payload = nil
		case 3:
			e.Headers = map[string]string{"quote": `a "b" \c`, "unicode": "é✓"}
			e.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		case 4:
			e.Payload = bytes.Repeat([]byte("x"), 200<<10)
		}
		evs = append(evs, e)
	}
	return evs
}

// addHanded writes evs in one transaction as the inbox's group commit does, with a
// txdefer.Commit that runs once it committed. With rollback the transaction is rolled back.
func addHanded(t *testing.T, db *sql.DB, w *outbox.Writer, evs []outbox.Event, rollback bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := txdefer.NewCommit(db, tx)
	if err := w.AddBatch(txdefer.WithCommit(ctx, c), tx, evs); err != nil {
		t.Fatalf("AddBatch: %v", err)
	}
	for _, e := range evs { // the caller reuses its buffers once AddBatch returned
		for i := range e.Payload {
			e.Payload[i] = '!'
		}
	}
	if rollback {
		_ = tx.Rollback()
		return
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	c.Committed()
}

// relayAll runs RelayOnce until nothing is pending.
func relayAll(t *testing.T, r *outbox.Relay) {
	t.Helper()
	for range 100 {
		n, err := r.RelayOnce(context.Background())
		if err != nil {
			t.Fatalf("RelayOnce: %v", err)
		}
		if n == 0 {
			return
		}
	}
	t.Fatal("RelayOnce still publishing after 100 batches")
}

// TestEOSRelayHandOff checks that events a Writer hands to the exactly-once relay of its
// pool are published from memory. They are on Kafka exactly as the same events read back
// from the database. Two relays on two databases, one with the hand-off and one without,
// publish the same values, keys and headers to two topics.
//
// The test also shows what the hand-off must not give the relay.
//   - A rolled-back transaction's rows are never published.
//   - Rows written without a group commit's txdefer.Commit are read back.
//   - The caller may reuse its buffers after AddBatch returned. The published payloads are
//     those inserted.
//   - The rows of a transaction of another pool given to the Writer are not handed over.
//
// The counts show which path each batch took, so the test fails if the hand-off is never
// used.
func TestEOSRelayHandOff(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)
	run := func(handOff int) ([]kafkax.Record, outbox.HandOffStats) {
		d := testenv.DB(t, 4)
		topic := testenv.Topic(t, k, "outbox-handoff", 1)
		r := newEOSRelay(t, d.DB, k, eosConfig(t, k, outbox.RelayConfig{BatchSize: 50, HandOffBytes: handOff, Linger: outbox.NoLinger}))
		w, err := outbox.NewWriter("outbox")
		if err != nil {
			t.Fatal(err)
		}
		w.UseStatements(d.DB)
		t.Cleanup(func() { _ = w.Close() })
		relayAll(t, r) // the relay's session starts (and empties the hand-off) before the rows come
		addHanded(t, d.DB, w, handOffEvents(topic, "rolled-back"), true)
		addHanded(t, d.DB, w, handOffEvents(topic, "a"), false)
		relayAll(t, r)
		addHanded(t, d.DB, w, handOffEvents(topic, "b")[:20], false)
		addCommitted(t, context.Background(), d.DB, newWriter(t), handOffEvents(topic, "plain")[:5]...) // no Commit: not handed
		// The same Writer is given a transaction of another pool. Those rows are another
		// database's, whose ids mean nothing to this relay.
		other := testenv.DB(t, 4)
		addHanded(t, other.DB, w, handOffEvents(topic, "other")[:5], false)
		relayAll(t, r)
		if n := pendingRows(t, d.DB); n != 0 {
			t.Fatalf("%d rows unpublished", n)
		}
		return readAll(t, k, topic), r.HandOff()
	}
	with, stats := run(4 << 20)
	without, none := run(outbox.NoHandOff)

	if !testenv.Dialect().Returning() { // MySQL 8: no INSERT … RETURNING, nothing handed
		if stats.Handed != 0 || stats.Batches != 0 {
			t.Fatalf("hand-off %+v on a server without INSERT … RETURNING; want nothing handed", stats)
		}
	} else if stats.Handed != 60 || stats.Batches == 0 || stats.ReadBack == 0 || none != (outbox.HandOffStats{}) {
		t.Fatalf("hand-off %+v (off: %+v); want 60 rows handed (the rolled-back 40 never), batches taken from it and read back", stats, none)
	}
	var ids []string
	for _, e := range handOffEvents("", "a") {
		ids = append(ids, e.ID)
	}
	for _, e := range handOffEvents("", "b")[:20] {
		ids = append(ids, e.ID)
	}
	for _, e := range handOffEvents("", "plain")[:5] {
		ids = append(ids, e.ID)
	}
	assertExactlyOnce(t, with, ids)
	assertExactlyOnce(t, without, ids)
	want := map[string]outbox.Event{}
	for _, p := range []string{"a", "b", "plain"} {
		for _, e := range handOffEvents("", p) {
			want[e.ID] = e
		}
	}
	for i := range with {
		a, b := with[i], without[i]
		id := a.Headers[outbox.HeaderEventID]
		if id != b.Headers[outbox.HeaderEventID] || a.Key != b.Key || !bytes.Equal(a.Value, b.Value) || !maps.Equal(a.Headers, b.Headers) {
			t.Fatalf("record %d differs with the hand-off:\n%s\nread back:\n%s", i, show(a), show(b))
		}
		if e := want[id]; !bytes.Equal(a.Value, e.Payload) && !(len(e.Payload) == 0 && len(a.Value) == 0) {
			t.Fatalf("event %s published with payload %q, want %q (as inserted)", id, trim(a.Value), trim(e.Payload))
		}
	}
}

func show(r kafkax.Record) string {
	return fmt.Sprintf("key %q value %q headers %v", r.Key, trim(r.Value), r.Headers)
}

func trim(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + fmt.Sprintf("…(%d bytes)", len(b))
	}
	return strings.ToValidUTF8(string(b), "?")
}

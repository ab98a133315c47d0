package engine_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

// eventer is a plain handler that writes its effect and one outbox event per delivery. The
// event id comes from the key, or from the part after "same-" for keys that share one. It
// fails chosen calls after both writes.
type eventer struct {
	*effects
	out  *outbox.Writer
	mu   sync.Mutex
	errs map[string][]error // what Add returned, per key
}

func (h *eventer) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	h.effects.mu.Lock()
	h.calls[d.Key]++
	n := h.calls[d.Key]
	h.effects.mu.Unlock()
	if _, err := tx.ExecContext(ctx, testenv.Rebind("INSERT INTO grouped_effect (k, step) VALUES (?, ?)"), d.Key, d.Step); err != nil {
		return inbox.Done, err
	}
	id := d.Key
	if _, shared, ok := strings.Cut(d.Key, "same-"); ok {
		id, _, _ = strings.Cut(shared, "/")
	}
	err := h.out.Add(ctx, tx, outbox.Event{ID: id, Type: "Credited", Topic: "grouped-events", Key: d.Key, Payload: []byte(d.Key)})
	h.mu.Lock()
	h.errs[d.Key] = append(h.errs[d.Key], err)
	h.mu.Unlock()
	if errors.Is(err, outbox.ErrDuplicateEvent) {
		return inbox.Done, inbox.Permanent(err)
	}
	if err != nil {
		return inbox.Done, err
	}
	if h.misbehave != nil {
		if err := h.misbehave(ctx, d.Key, n); err != nil {
			return inbox.Done, err
		}
	}
	return inbox.Done, nil
}

// TestGroupedOutboxEventsAtTheEnd checks that a grouped batch writes its deliveries'
// outbox events at its end, in one multi-row INSERT. Each committed delivery has exactly
// its one event. A delivery rolled back to its savepoint drops the event it added.
// Otherwise its retry would meet its own event as a duplicate. Two deliveries adding the
// same event id fail the batch's INSERT, and the batch falls back. One at a time, the
// second one's Add then reports ErrDuplicateEvent to its handler, as it does outside a
// batch.
func TestGroupedOutboxEventsAtTheEnd(t *testing.T) {
	out, err := outbox.NewWriter("outbox")
	if err != nil {
		t.Fatal(err)
	}
	h := &eventer{effects: newEffects(), out: out, errs: map[string][]error{}}
	h.misbehave = func(_ context.Context, key string, n int) error {
		if strings.HasPrefix(key, "once-") && n == 1 {
			return errors.New("a transient failure after the event was added")
		}
		return nil
	}
	g := newGrouped(t, h, engine.Config{MaxAttempts: 3}, engine.BatchConfig{Linger: 100 * time.Millisecond})
	db := g.db.DB

	// once-1 fails in the batch's first run, which has no savepoints, so the run is rolled
	// back whole. Its failure makes the next batches set savepoints from their first run.
	// So once-2 is rolled back to its savepoint, with its deferred event.
	for i, batch := range [][]string{append(keys("a", 40), "once-1"), append(keys("b", 40), "once-2")} {
		rs := g.send(t, batch)
		if o := outcomes(rs); o["processed"] != 41 {
			t.Fatalf("batch %d: outcomes %v, want 41 processed (stats %+v)", i, o, g.b.Stats())
		}
	}
	if st := g.b.Stats(); st.Isolated != 2 || st.Rollbacks != 1 {
		t.Fatalf("stats %+v: want once-1 and once-2 isolated, one rolled-back run (once-1's)", st)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox"); n != 82 {
		t.Errorf("%d events, want 82: one per processed delivery", n)
	}
	// The test's own join of two collations runs through the admin pool. In mysql8 mode the
	// application's pool refuses the MariaDB collation's name.
	if n := count(t, g.db.Admin, testenv.SQL("SELECT COUNT(*) FROM outbox o JOIN inbox i ON i.dedup_key = o.event_id COLLATE utf8mb4_nopad_bin AND i.status = 'done'",
		"SELECT COUNT(*) FROM outbox o JOIN inbox i ON i.dedup_key = o.event_id AND i.status = 'done'")); n != 82 {
		t.Errorf("%d events of done deliveries, want 82", n)
	}
	for _, k := range []string{"once-1", "once-2"} {
		if errs := h.errs[k]; len(errs) != 2 || errs[0] != nil || errs[1] != nil {
			t.Errorf("%s: Add returned %v, want two clean adds (the failed attempt's event was dropped)", k, errs)
		}
	}

	// Two keys share one event id, so the batch's INSERT fails and the batch falls back.
	fallbacks := g.b.Stats().Fallbacks
	batch := append(keys("c", 20), "same-x/1", "same-x/2")
	rs := g.send(t, batch)
	if o := outcomes(rs); o["processed"] != 21 || o["quarantined/permanent"] != 1 {
		t.Fatalf("outcomes %v, want 21 processed and the second same-x quarantined as permanent", o)
	}
	if st := g.b.Stats(); st.Fallbacks-fallbacks < int64(len(batch)) {
		t.Errorf("stats %+v: want the whole batch fallen back after its INSERT failed", st)
	}
	dups := 0
	for _, k := range []string{"same-x/1", "same-x/2"} {
		for _, err := range h.errs[k] {
			if errors.Is(err, outbox.ErrDuplicateEvent) {
				dups++
			}
		}
	}
	if dups != 1 {
		t.Errorf("Add reported ErrDuplicateEvent %d times to the same-x handlers (%v, %v), want once", dups, h.errs["same-x/1"], h.errs["same-x/2"])
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox WHERE event_id = 'x'"); n != 1 {
		t.Errorf("%d events with id x, want 1", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox"); n != 82+21 {
		t.Errorf("%d events, want %d", n, 82+21)
	}
}

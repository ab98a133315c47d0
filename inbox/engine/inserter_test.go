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
	"github.com/onceflow/onceflow/pkg/dbx"
)

// inserting is a plain handler that writes its effect through inbox.Inserters. It writes
// one row per key into inserted_effect, where the key is the primary key. It upserts 1
// onto the key's group in inserted_total, the group being the part before "-". It looks
// for its own row right after Insert, and fails chosen calls after both writes.
type inserting struct {
	*effects
	row, total *inbox.Inserter
	mu         sync.Mutex
	seen       map[string][]int // rows of its key found right after Insert, per call
	errs       map[string][]error
}

func newInserting(t *testing.T) *inserting {
	t.Helper()
	row, err := inbox.NewInserter("inserted_effect", "k", "step")
	if err != nil {
		t.Fatal(err)
	}
	total, err := inbox.NewInserter("inserted_total", "grp", "n")
	if err != nil {
		t.Fatal(err)
	}
	return &inserting{effects: newEffects(), row: row, total: total.OnDuplicateKeyUpdate("n = n + VALUES(n)").OnConflictUpdate("grp", "n = inserted_total.n + EXCLUDED.n"),
		seen: map[string][]int{}, errs: map[string][]error{}}
}

func (h *inserting) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	h.effects.mu.Lock()
	h.calls[d.Key]++
	n := h.calls[d.Key]
	h.txs[d.Key] = append(h.txs[d.Key], tx)
	h.effects.mu.Unlock()
	err := h.row.Insert(ctx, tx, d.Key, d.Step)
	seen := -1 // not read after a failed INSERT: PostgreSQL's transaction runs nothing more
	if err == nil {
		if qerr := tx.QueryRowContext(ctx, testenv.Rebind("SELECT COUNT(*) FROM inserted_effect WHERE k = ?"), d.Key).Scan(&seen); qerr != nil {
			return inbox.Done, qerr
		}
	}
	h.mu.Lock()
	h.errs[d.Key] = append(h.errs[d.Key], err)
	h.seen[d.Key] = append(h.seen[d.Key], seen)
	h.mu.Unlock()
	if dbx.IsDuplicate(err) {
		return inbox.Done, inbox.Permanent(err)
	}
	if err != nil {
		return inbox.Done, err
	}
	grp, _, _ := strings.Cut(d.Key, "-")
	if err := h.total.Insert(ctx, tx, grp, 1); err != nil {
		return inbox.Done, err
	}
	if h.misbehave != nil {
		if err := h.misbehave(ctx, d.Key, n); err != nil {
			return inbox.Done, err
		}
	}
	return inbox.Done, nil
}

func (h *inserting) seenOf(key string) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[key]
}

// TestInserterRowsAtTheEndOfTheBatch checks that an Inserter's rows wait for the end of a
// grouped batch, and go out in multi-row INSERTs. Each committed delivery has exactly its
// row and its share of the upserted totals. A delivery rolled back, with its run or to its
// savepoint, drops the rows it inserted. Otherwise its retry would meet its own row as a
// duplicate key. A row that breaks a unique key fails the batch's INSERT, and the batch
// falls back. One at a time, Insert then returns the duplicate to its own delivery alone.
// With one delivery per transaction, Insert writes at once.
func TestInserterRowsAtTheEndOfTheBatch(t *testing.T) {
	h := newInserting(t)
	h.misbehave = func(_ context.Context, key string, n int) error {
		if strings.HasPrefix(key, "once-") && n == 1 {
			return errors.New("a transient failure after the inserts")
		}
		return nil
	}
	g := newGrouped(t, h, engine.Config{MaxAttempts: 3}, engine.BatchConfig{Linger: 100 * time.Millisecond})
	db := g.db.DB
	g.db.AdminExec(t, "CREATE TABLE inserted_effect (k VARCHAR(64) PRIMARY KEY, step INT NOT NULL)")
	g.db.AdminExec(t, "CREATE TABLE inserted_total (grp VARCHAR(64) PRIMARY KEY, n INT NOT NULL)")

	// once-1 fails in its batch's first run, which has no savepoints, so the run is rolled
	// back whole. once-2, in the next batch, is rolled back to its savepoint.
	for i, batch := range [][]string{append(keys("a", 40), "once-1"), append(keys("b", 40), "once-2")} {
		rs := g.send(t, batch)
		if o := outcomes(rs); o["processed"] != 41 {
			t.Fatalf("batch %d: outcomes %v, want 41 processed (stats %+v)", i, o, g.b.Stats())
		}
	}
	if st := g.b.Stats(); st.Isolated != 2 || st.Rollbacks != 1 || st.Fallbacks != 0 {
		t.Fatalf("stats %+v: want once-1 and once-2 isolated, one rolled-back run (once-1's), no fallback", st)
	}
	// The insert is deferred. In a batch, a delivery's own row is not in the table right
	// after Insert.
	if seen := h.seenOf("b-0007"); len(seen) != 1 || seen[0] != 0 {
		t.Errorf("b-0007 found its row %v times right after Insert in a batch, want [0]: the insert was not deferred", seen)
	}
	for _, k := range []string{"once-1", "once-2"} {
		if errs := h.errs[k]; len(errs) != 2 || errs[0] != nil || errs[1] != nil {
			t.Errorf("%s: Insert returned %v, want two clean inserts (the failed attempt's row was dropped)", k, errs)
		}
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inserted_effect e JOIN inbox i ON i.dedup_key = e.k AND i.status = 'done'"); n != 82 {
		t.Errorf("%d rows of done deliveries, want 82", n)
	}
	for grp, want := range map[string]int{"a": 40, "b": 40, "once": 2} {
		if n := count(t, db, "SELECT n FROM inserted_total WHERE grp = ?", grp); n != want {
			t.Errorf("total of %s: %d, want %d (one per committed delivery)", grp, n, want)
		}
	}

	// A row is already there. The batch's INSERT fails on its key, and the batch falls
	// back. The one delivery the row belongs to is told, and this handler quarantines it as
	// permanent.
	if _, err := db.Exec("INSERT INTO inserted_effect (k, step) VALUES ('c-taken', 9)"); err != nil {
		t.Fatal(err)
	}
	batch := append(keys("c", 20), "c-taken")
	rs := g.send(t, batch)
	if o := outcomes(rs); o["processed"] != 20 || o["quarantined/permanent"] != 1 {
		t.Fatalf("outcomes %v, want 20 processed and c-taken quarantined as permanent", o)
	}
	if st := g.b.Stats(); st.Fallbacks < int64(len(batch)) {
		t.Errorf("stats %+v: want the whole batch fallen back after its INSERT failed", st)
	}
	var dups int
	for _, k := range append(keys("c", 20), "c-taken") {
		for _, err := range h.errs[k] {
			if err != nil {
				if k != "c-taken" || !dbx.IsDuplicate(err) || !strings.Contains(err.Error(), "inserted_effect") {
					t.Errorf("%s: Insert returned %v; only c-taken's may fail, with the duplicate key of inserted_effect", k, err)
				}
				dups++
			}
		}
	}
	if dups != 1 {
		t.Errorf("Insert reported a duplicate %d times, want once (to c-taken, one at a time)", dups)
	}
	// One at a time, on the fallback, Insert writes at once. The row is there right after.
	if seen := h.seenOf("c-0003"); len(seen) != 2 || seen[0] != 0 || seen[1] != 1 {
		t.Errorf("c-0003 found its row %v times right after Insert (batch, then alone), want [0 1]", seen)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inserted_effect"); n != 82+21 {
		t.Errorf("%d rows, want %d", n, 82+21)
	}
	if n := count(t, db, "SELECT n FROM inserted_total WHERE grp = 'c'"); n != 20 {
		t.Errorf("total of c: %d, want 20 (c-taken failed before its upsert)", n)
	}
}

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

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestGroupedPlainHandlerSharesTransactions checks that a plain handler is group-committed.
// 200 deliveries that arrive together run in a few shared transactions, not 200. Each
// delivery ends with its effect and its inbox row 'done'.
func TestGroupedPlainHandlerSharesTransactions(t *testing.T) {
	h := newEffects()
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{Linger: 50 * time.Millisecond})
	rs := g.send(t, keys("many", 200))
	if o := outcomes(rs); o["processed"] != 200 {
		t.Fatalf("outcomes %v, want 200 processed", o)
	}
	txs := h.transactions()
	st := g.b.Stats()
	t.Logf("200 deliveries in %d transactions; stats %+v", len(txs), st)
	if len(txs) > 20 || st.Batches > 20 || st.Batched != 200 || st.Fallbacks != 0 {
		t.Fatalf("%d transactions, stats %+v: want every delivery batched, in at most 20 transactions", len(txs), st)
	}
	db := g.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM grouped_effect"); n != 200 {
		t.Fatalf("%d effects, want 200", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'done' AND attempts = 1"); n != 200 {
		t.Fatalf("%d done rows with one attempt, want 200", n)
	}
}

// TestGroupedFailureRollsBackAlone checks that a delivery whose Handle fails is rolled back
// alone, with its own write undone, while its batch-mates commit. It is then retried
// alone.
//
// The batch's first run sets no savepoints. The first failure, always-1, first in key
// order, rolls the run back. The batch runs again without always-1, with every delivery
// behind a savepoint. So the later failures are rolled back to their savepoints in the
// transaction that commits the good ones.
//
// A delivery that always fails is quarantined after inbox.max_attempts attempts in all,
// and the batch's attempt is counted on its row. One that fails once is processed on its
// retry. One that returns an invalid Progress is never taken for done. A Permanent failure
// is quarantined at once.
func TestGroupedFailureRollsBackAlone(t *testing.T) {
	h := newEffects()
	h.misbehave = func(_ context.Context, key string, n int) error {
		switch {
		case strings.HasPrefix(key, "always-"):
			return errors.New("downstream keeps failing")
		case strings.HasPrefix(key, "once-") && n == 1:
			return errors.New("a transient failure")
		case strings.HasPrefix(key, "permanent-"):
			return inbox.Permanent(errors.New("this order can never be credited"))
		}
		return nil
	}
	h.progress = func(key string, _ int) inbox.Progress {
		if strings.HasPrefix(key, "zero-") {
			return 0 // forgot to say: must not be taken for Done
		}
		return inbox.Done
	}
	g := newGrouped(t, h, engine.Config{MaxAttempts: 3}, engine.BatchConfig{Linger: 100 * time.Millisecond})
	payloads := append(keys("ok", 30), "always-1", "once-1", "permanent-1", "zero-1")
	rs := g.send(t, payloads)
	want := map[string]int{"processed": 31, "quarantined/retries_exhausted": 2, "quarantined/permanent": 1}
	if o := outcomes(rs); fmt.Sprint(o) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v (stats %+v)", o, want, g.b.Stats())
	}
	// The failing ones ran in the transaction that committed their batch-mates.
	okTx := map[*sql.Tx]bool{}
	for _, k := range keys("ok", 30) {
		okTx[h.firstTx(k)] = true
	}
	for _, k := range []string{"once-1", "permanent-1", "zero-1"} {
		if !okTx[h.firstTx(k)] {
			t.Errorf("%s's first attempt did not run in the transaction of the good deliveries", k)
		}
	}
	if okTx[h.firstTx("always-1")] {
		t.Error("always-1 failed in the batch's first run, without savepoints: that run must have been rolled back")
	}
	db := g.db.DB
	for key, effects := range map[string]int{"always-1": 0, "once-1": 1, "permanent-1": 0, "zero-1": 0, "ok-0007": 1} {
		if n := count(t, db, "SELECT COUNT(*) FROM grouped_effect WHERE k = ?", key); n != effects {
			t.Errorf("%s: %d effects, want %d", key, n, effects)
		}
	}
	for key, calls := range map[string]int{"always-1": 3, "once-1": 2, "permanent-1": 1, "zero-1": 3} {
		if n := h.callsOf(key); n != calls {
			t.Errorf("%s: Handle called %d times, want %d", key, n, calls)
		}
	}
	if n := count(t, db, "SELECT attempts FROM inbox WHERE dedup_key = 'always-1' AND status = 'failed'"); n != 3 {
		t.Errorf("always-1: %d attempts on its quarantined row, want 3", n)
	}
	if n := count(t, db, "SELECT attempts FROM inbox WHERE dedup_key = 'once-1' AND status = 'done'"); n != 2 {
		t.Errorf("once-1: %d attempts on its done row, want 2 (the batch's failed one counted)", n)
	}
	var lastErr string
	if err := db.QueryRow("SELECT last_error FROM inbox WHERE dedup_key = 'zero-1'").Scan(&lastErr); err != nil || !strings.Contains(lastErr, "invalid inbox.Progress") {
		t.Errorf("zero-1: last_error %q (%v), want the invalid Progress named", lastErr, err)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'done'"); n != 31 {
		t.Errorf("%d done rows, want 31", n)
	}
	if st := g.b.Stats(); st.Isolated != 4 || st.Rollbacks != 1 || st.Batches != 1 {
		t.Errorf("stats %+v: want the 4 failing deliveries isolated, one batch committed after one rolled-back run", st)
	}

	// Within savepointsAfterFailure of a failure, batches set savepoints from their first
	// run. A failing delivery is rolled back to its savepoint, and no run is rolled back.
	rs = g.send(t, append(keys("later", 10), "always-2"))
	if o := outcomes(rs); o["processed"] != 10 || o["quarantined/retries_exhausted"] != 1 {
		t.Fatalf("second batch: %v", outcomes(rs))
	}
	if st := g.b.Stats(); st.Rollbacks != 1 || st.Isolated != 5 {
		t.Errorf("stats %+v: want always-2 isolated by its savepoint, without a rolled-back run", st)
	}
	if h.firstTx("always-2") != h.firstTx("later-0003") {
		t.Error("always-2 did not fail in the transaction that committed its batch-mates")
	}
}

// TestGroupedPanicAndTimeoutQuarantinedAlone checks that a panicking Handle is rolled back
// to its savepoint, with its write and row lock. The batch commits the others. After
// inbox.max_attempts panics in all, the delivery is quarantined with reason panic and the
// stack. A Handle that blocks past inbox.handler_timeout is taken out of its batch, and the
// transaction it may still use is abandoned. The others commit in a new one, and it ends
// quarantined with reason timeout. No transaction is left open.
func TestGroupedPanicAndTimeoutQuarantinedAlone(t *testing.T) {
	h := newEffects()
	var panics atomic.Int64
	h.misbehave = func(ctx context.Context, key string, _ int) error {
		switch {
		case strings.HasPrefix(key, "panic-"):
			panics.Add(1)
			panic("plugin bug on " + key)
		case strings.HasPrefix(key, "block-"):
			select {} // ignores its context
		}
		return nil
	}
	g := newGrouped(t, h, engine.Config{MaxAttempts: 2, HandlerTimeout: 500 * time.Millisecond}, engine.BatchConfig{Linger: 100 * time.Millisecond})
	payloads := append(keys("ok", 20), "panic-1", "panic-2", "block-1")
	rs := g.send(t, payloads)
	want := map[string]int{"processed": 20, "quarantined/panic": 2, "quarantined/timeout": 1}
	if o := outcomes(rs); fmt.Sprint(o) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v (stats %+v)", o, want, g.b.Stats())
	}
	if n := panics.Load(); n != 4 {
		t.Errorf("%d panics, want 4 (2 keys x inbox.max_attempts 2)", n)
	}
	db := g.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM grouped_effect WHERE k LIKE 'panic-%' OR k LIKE 'block-%'"); n != 0 {
		t.Errorf("%d effects of misbehaving deliveries committed", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM grouped_effect WHERE k LIKE 'ok-%'"); n != 20 {
		t.Errorf("%d effects of good deliveries, want 20", n)
	}
	var lastErr string
	if err := db.QueryRow("SELECT last_error FROM inbox WHERE dedup_key = 'panic-1'").Scan(&lastErr); err != nil || !strings.Contains(lastErr, "goroutine") {
		t.Errorf("panic-1: last_error %.200q (%v), want the panic and its stack", lastErr, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testenv.OpenTransactions(t, g.db.Name) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d transactions still open", testenv.OpenTransactions(t, g.db.Name))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGroupedDuplicatesWithinAndAcrossBatches checks that copies of a key in one batch and
// redeliveries in later batches are duplicates. Each key has one effect, and every copy is
// counted on its row.
func TestGroupedDuplicatesWithinAndAcrossBatches(t *testing.T) {
	h := newEffects()
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{Linger: 100 * time.Millisecond})
	ks := keys("dup", 50)
	var payloads []string
	for range 3 {
		payloads = append(payloads, ks...)
	}
	rs := g.send(t, payloads)
	if o := outcomes(rs); o["processed"] != 50 || o["duplicate"] != 100 {
		t.Fatalf("first wave: %v, want 50 processed and 100 duplicates", o)
	}
	rs = g.send(t, ks)
	if o := outcomes(rs); o["duplicate"] != 50 {
		t.Fatalf("redelivery: %v, want 50 duplicates", o)
	}
	db := g.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM grouped_effect"); n != 50 {
		t.Fatalf("%d effects, want 50", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'done' AND duplicates = 3"); n != 50 {
		t.Fatalf("%d rows with 3 duplicates counted, want 50", n)
	}
	for _, k := range ks {
		if c := h.callsOf(k); c != 1 {
			t.Fatalf("%s: Handle ran %d times, want once", k, c)
		}
	}
}

// TestGroupedConcurrentCopiesOneEffect delivers 200 concurrent copies of one key, and
// 1,000 keys three times each at once. Each key has one effect. The same load through
// SELECT-then-INSERT produces duplicates, so the assertions can fail.
func TestGroupedConcurrentCopiesOneEffect(t *testing.T) {
	h := newEffects()
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{})
	db := g.db.DB
	g.db.AdminExec(t, testenv.SQL("CREATE TABLE naive_effect (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL)",
		"CREATE TABLE naive_effect (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, k VARCHAR(64) NOT NULL)"))
	naive := func(key string) error {
		var n int
		if err := db.QueryRow(testenv.Rebind("SELECT COUNT(*) FROM naive_effect WHERE k = ?"), key).Scan(&n); err != nil || n > 0 {
			return err
		}
		time.Sleep(time.Millisecond)
		_, err := db.Exec(testenv.Rebind("INSERT INTO naive_effect (k) VALUES (?)"), key)
		return err
	}
	runNaive := func(ks []string) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, k := range ks {
			wg.Go(func() {
				<-start
				if err := naive(k); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
	}

	hot := make([]string, 200)
	for i := range hot {
		hot[i] = "hot"
	}
	if o := outcomes(g.send(t, hot)); o["processed"] != 1 || o["duplicate"] != 199 {
		t.Fatalf("200 copies of one key: %v, want 1 processed and 199 duplicates", o)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM grouped_effect WHERE k = 'hot'"); n != 1 {
		t.Fatalf("hot: %d effects, want 1", n)
	}
	if n := count(t, db, "SELECT duplicates FROM inbox WHERE dedup_key = 'hot'"); n != 199 {
		t.Fatalf("hot: %d duplicates counted, want 199", n)
	}
	runNaive(hot)
	if n := count(t, db, "SELECT COUNT(*) FROM naive_effect WHERE k = 'hot'"); n < 2 {
		t.Fatalf("the naive path gave %d effects for 200 copies; the test could not have caught a duplicate", n)
	}

	var bulk []string
	for _, k := range keys("bulk", 1000) {
		bulk = append(bulk, k, k, k)
	}
	if o := outcomes(g.send(t, bulk)); o["processed"] != 1000 || o["duplicate"] != 2000 {
		t.Fatalf("1,000 keys x 3: %v", o)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM (SELECT k FROM grouped_effect WHERE k LIKE 'bulk-%' GROUP BY k HAVING COUNT(*) = 1) d"); n != 1000 {
		t.Fatalf("%d keys with exactly one effect, want 1000", n)
	}
	runNaive(bulk)
	if n := count(t, db, "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) n FROM naive_effect WHERE k LIKE 'bulk-%' GROUP BY k) d"); n == 0 {
		t.Fatal("the naive path produced no duplicates; the test could not have caught one")
	}
	t.Logf("stats %+v", g.b.Stats())
}

// TestGroupedMultiStep checks a multi-step handler. With one step per transaction, its
// first step commits with the batch, and the one-at-a-time path resumes it. With
// steps_per_transaction 2, both steps run inside its savepoint, and it finishes in the
// batch. Either way each step has one effect.
func TestGroupedMultiStep(t *testing.T) {
	for _, spt := range []int{1, 2} {
		t.Run(fmt.Sprintf("steps_per_transaction=%d", spt), func(t *testing.T) {
			h := newEffects()
			h.progress = func(_ string, n int) inbox.Progress {
				if n == 1 {
					return inbox.Continue
				}
				return inbox.Done
			}
			g := newGrouped(t, h, engine.Config{StepsPerTx: spt}, engine.BatchConfig{Linger: 50 * time.Millisecond})
			if o := outcomes(g.send(t, keys("multi", 40))); o["processed"] != 40 {
				t.Fatalf("outcomes %v", o)
			}
			if n := count(t, g.db.DB, "SELECT COUNT(*) FROM (SELECT k FROM grouped_effect GROUP BY k HAVING COUNT(*) = 2) d"); n != 40 {
				t.Fatalf("%d keys with two step effects, want 40", n)
			}
			st := g.b.Stats()
			if spt == 1 && st.Fallbacks != 40 || spt == 2 && (st.Fallbacks != 0 || st.Batched != 40) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// prepared is effects with a Preparer. Prepare runs for each delivery before its batch,
// outside any transaction. A delivery whose Prepare failed never runs Handle in a batch.
type prepared struct {
	*effects
	mu       sync.Mutex
	prepares map[string]int
	fail     func(key string, n int) error
	inBatch  atomic.Int64 // Handle calls that found nothing prepared
}

func (p *prepared) Prepare(_ context.Context, d *inbox.Delivery) error {
	p.mu.Lock()
	p.prepares[d.Key]++
	n := p.prepares[d.Key]
	p.mu.Unlock()
	if err := p.fail(d.Key, n); err != nil {
		return err
	}
	d.Prepared = "ready:" + d.Key
	return nil
}

func (p *prepared) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if d.Prepared != "ready:"+d.Key {
		p.inBatch.Add(1)
		return inbox.Done, fmt.Errorf("%s: Handle without its Prepare (%v)", d.Key, d.Prepared)
	}
	return p.effects.Handle(ctx, tx, d)
}

// TestGroupedPreparer checks that a plain Preparer's Prepare runs once per delivery
// outside the batch, and that Handle finds what it prepared. A failed Prepare counts as an
// attempt, and the delivery is retried alone. Handle never runs unprepared.
func TestGroupedPreparer(t *testing.T) {
	h := &prepared{effects: newEffects(), prepares: map[string]int{}, fail: func(key string, n int) error {
		if strings.HasPrefix(key, "flaky-") && n == 1 {
			return errors.New("the slow service timed out")
		}
		return nil
	}}
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{Linger: 50 * time.Millisecond})
	payloads := append(keys("ok", 30), "flaky-1", "flaky-2")
	if o := outcomes(g.send(t, payloads)); o["processed"] != 32 {
		t.Fatalf("outcomes %v (stats %+v)", o, g.b.Stats())
	}
	if n := h.inBatch.Load(); n != 0 {
		t.Fatalf("Handle ran %d times without its Prepare", n)
	}
	for _, k := range []string{"ok-0003", "flaky-1"} {
		want := 1
		if strings.HasPrefix(k, "flaky-") {
			want = 2
		}
		h.mu.Lock()
		n := h.prepares[k]
		h.mu.Unlock()
		if n != want {
			t.Errorf("%s: %d prepares, want %d", k, n, want)
		}
	}
	if st := g.b.Stats(); st.Prepared != 30 || st.PrepareFailed != 2 || st.Batched < 30 {
		t.Fatalf("stats %+v: want the 30 good deliveries prepared and batched", st)
	}
	if n := count(t, g.db.DB, "SELECT attempts FROM inbox WHERE dedup_key = 'flaky-1'"); n != 2 {
		t.Fatalf("flaky-1: %d attempts on its row, want 2 (the failed Prepare counted)", n)
	}
}

// TestConflictLeavesTheRowAlone checks that a delivery whose key is taken by another
// payload is quarantined under a key of its own. The taken row is not changed, its
// updated_at included. On PostgreSQL the claim's ON CONFLICT update assigns nothing new,
// and the trigger moves updated_at only on a change.
func TestConflictLeavesTheRowAlone(t *testing.T) {
	g := newEffectsInbox(t, newEffects(), engine.Config{})
	ctx := context.Background()
	first, err := g.inbox.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte("k|a")), inbox.Source{Topic: "grouped"}, engine.ProcessOptions{})
	if err != nil || first.Outcome != engine.OutcomeProcessed {
		t.Fatalf("first: %+v, %v", first, err)
	}
	read := func() (at time.Time) {
		if err := g.db.DB.QueryRow(testenv.Rebind("SELECT updated_at FROM inbox WHERE id = ?"), first.InboxID).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	before := read()
	time.Sleep(5 * time.Millisecond)
	r, err := g.inbox.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte("k|b")), inbox.Source{Topic: "grouped", Offset: 1}, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeConflict {
		t.Fatalf("conflict: %+v, %v", r, err)
	}
	if after := read(); !after.Equal(before) {
		t.Fatalf("updated_at of the taken row moved from %v to %v", before, after)
	}
}

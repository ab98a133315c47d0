package coupon_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

const valueCents = 500

// rb is q with the placeholders of the tests' database.
func rb(q string) string { return testenv.Dialect().Rebind(q) }

// campaign returns a granter configuration for a fresh campaign.
func campaign(id string, stock, budget int64) coupon.Config {
	cfg := coupon.DefaultConfig()
	cfg.CampaignID = id
	cfg.ValueCents = valueCents
	cfg.StockTotal = stock
	cfg.BudgetCents = budget
	return cfg
}

// setup creates the campaign and its granter.
func setup(t *testing.T, db *sql.DB, cfg coupon.Config, svc coupon.ExternalService) *coupon.Granter {
	t.Helper()
	if err := coupon.EnsureCampaign(context.Background(), db, cfg); err != nil {
		t.Fatalf("EnsureCampaign: %v", err)
	}
	g, err := coupon.NewGranter(cfg, svc, nil)
	if err != nil {
		t.Fatalf("NewGranter: %v", err)
	}
	return g
}

// plugin is g as the plugin runs it on db, through Granter.Handler. It is closed when the
// test ends.
func plugin(t *testing.T, db *sql.DB, g *coupon.Granter) inbox.Handler {
	t.Helper()
	h, err := g.Handler(db)
	if err != nil {
		t.Fatalf("Handler: %v", err)
	}
	t.Cleanup(func() { _ = h.(io.Closer).Close() })
	return h
}

func order(id string) coupon.OrderPaid {
	return coupon.OrderPaid{OrderID: id, UserID: "user-" + id, AmountCents: 9900, PaidAt: time.Date(2024, 11, 11, 0, 0, 0, 0, time.UTC)}
}

// step runs one Granter.Step in its own transaction. An error rolls the step back.
func step(ctx context.Context, db *sql.DB, g *coupon.Granter, o coupon.OrderPaid) (inbox.Progress, error) {
	var p inbox.Progress
	err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
		var err error
		p, err = g.Step(ctx, tx, o)
		return err
	})
	return p, err
}

// retryable are the errors after which a rolled-back step is simply run again.
func retryable(err error) bool {
	return errors.Is(err, coupon.ErrStaleState) || dbx.IsLockConflict(err) || errors.Is(err, coupon.ErrInjected)
}

// runToDone steps o until Done, retrying retryable errors. It returns how many steps were
// rolled back.
func runToDone(ctx context.Context, db *sql.DB, g *coupon.Granter, o coupon.OrderPaid) (retries int, err error) {
	for attempt := 0; attempt < 1000; attempt++ {
		p, err := step(ctx, db, g, o)
		switch {
		case err == nil && p == inbox.Done:
			return retries, nil
		case err == nil:
		case retryable(err):
			retries++
		default:
			return retries, err
		}
	}
	return retries, fmt.Errorf("order %s not done after 1000 steps", o.OrderID)
}

func mustRunToDone(t *testing.T, db *sql.DB, g *coupon.Granter, o coupon.OrderPaid) {
	t.Helper()
	if _, err := runToDone(context.Background(), db, g, o); err != nil {
		t.Fatalf("order %s: %v", o.OrderID, err)
	}
}

type counters struct{ Locked, Granted, Spent int64 }

func readCounters(t *testing.T, db *sql.DB, campaignID string) counters {
	t.Helper()
	var c counters
	if err := db.QueryRow(rb(`SELECT (SELECT SUM(locked) FROM coupon_stock WHERE campaign_id = ?), (SELECT SUM(granted) FROM coupon_stock WHERE campaign_id = ?),
		(SELECT SUM(spent_cents) FROM coupon_budget WHERE campaign_id = ?)`), campaignID, campaignID, campaignID).Scan(&c.Locked, &c.Granted, &c.Spent); err != nil {
		t.Fatalf("read counters: %v", err)
	}
	return c
}

type grantState struct {
	State    coupon.State
	Version  int
	CouponID sql.NullString
	Reason   sql.NullString
}

func readGrant(t *testing.T, db *sql.DB, orderID, campaignID string) grantState {
	t.Helper()
	var g grantState
	if err := db.QueryRow(rb(`SELECT state, version, coupon_id, reason FROM coupon_grant WHERE order_id = ? AND campaign_id = ?`),
		orderID, campaignID).Scan(&g.State, &g.Version, &g.CouponID, &g.Reason); err != nil {
		t.Fatalf("read grant %s: %v", orderID, err)
	}
	return g
}

func count(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(rb(q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func transitions(t *testing.T, db *sql.DB, orderID, campaignID string) []string {
	t.Helper()
	rows, err := db.Query(rb(`SELECT from_state, to_state FROM coupon_grant_log WHERE order_id = ? AND campaign_id = ? ORDER BY id`), orderID, campaignID)
	if err != nil {
		t.Fatalf("read log: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var from, to string
		if err := rows.Scan(&from, &to); err != nil {
			t.Fatalf("read log: %v", err)
		}
		out = append(out, from+"->"+to)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read log: %v", err)
	}
	return out
}

var happyLog = []string{"INIT->LOCKED", "LOCKED->BUDGET_DEDUCTED", "BUDGET_DEDUCTED->GRANTED"}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// snapshot is everything a repeated step must leave unchanged.
type snapshot struct {
	Counters counters
	Grant    grantState
	Coupons  int
	Log      int
	Outbox   int
}

func takeSnapshot(t *testing.T, db *sql.DB, orderID, campaignID string) snapshot {
	t.Helper()
	return snapshot{
		Counters: readCounters(t, db, campaignID),
		Grant:    readGrant(t, db, orderID, campaignID),
		Coupons:  count(t, db, `SELECT COUNT(*) FROM user_coupon WHERE campaign_id = ?`, campaignID),
		Log:      count(t, db, `SELECT COUNT(*) FROM coupon_grant_log WHERE campaign_id = ?`, campaignID),
		Outbox:   count(t, db, `SELECT COUNT(*) FROM outbox`),
	}
}

func mustVerify(t *testing.T, db *sql.DB, campaignID string) coupon.Audit {
	t.Helper()
	a, err := coupon.Verify(context.Background(), db, campaignID, time.Hour)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !a.OK() {
		t.Fatalf("Verify: violations:\n%s", strings.Join(a.Violations, "\n"))
	}
	return a
}

func TestGrantHappyPath(t *testing.T) {
	d := testenv.DB(t, 4, couponSchema)
	ctx := context.Background()
	cfg := campaign("happy", 10, 10*valueCents)
	g := setup(t, d.DB, cfg, nil)
	o := order("order-1")

	wantStates := []coupon.State{coupon.StateLocked, coupon.StateBudgetDeducted, coupon.StateGranted}
	wantProgress := []inbox.Progress{inbox.Continue, inbox.Continue, inbox.Done}
	wantCounters := []counters{{1, 0, 0}, {1, 0, valueCents}, {0, 1, valueCents}}
	for i := range wantStates {
		p, err := step(ctx, d.DB, g, o)
		if err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		if p != wantProgress[i] {
			t.Fatalf("step %d: progress %v, want %v", i+1, p, wantProgress[i])
		}
		gr := readGrant(t, d.DB, o.OrderID, cfg.CampaignID)
		if gr.State != wantStates[i] || gr.Version != i+1 {
			t.Fatalf("after step %d: state %s version %d, want %s version %d", i+1, gr.State, gr.Version, wantStates[i], i+1)
		}
		if c := readCounters(t, d.DB, cfg.CampaignID); c != wantCounters[i] {
			t.Fatalf("after step %d: counters %+v, want %+v", i+1, c, wantCounters[i])
		}
	}

	couponID := coupon.CouponID(o.OrderID, cfg.CampaignID)
	gr := readGrant(t, d.DB, o.OrderID, cfg.CampaignID)
	if gr.CouponID.String != couponID || gr.Reason.Valid {
		t.Errorf("grant coupon_id %v reason %v, want %s and NULL", gr.CouponID, gr.Reason, couponID)
	}
	var uc struct {
		CouponID, UserID string
		Value            int64
	}
	if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon`); n != 1 {
		t.Fatalf("%d user_coupon rows, want 1", n)
	}
	if err := d.DB.QueryRow(rb(`SELECT coupon_id, user_id, value_cents FROM user_coupon WHERE order_id = ? AND campaign_id = ?`),
		o.OrderID, cfg.CampaignID).Scan(&uc.CouponID, &uc.UserID, &uc.Value); err != nil {
		t.Fatalf("read user_coupon: %v", err)
	}
	if uc.CouponID != couponID || uc.UserID != o.UserID || uc.Value != valueCents {
		t.Errorf("user_coupon %+v, want coupon %s user %s value %d", uc, couponID, o.UserID, valueCents)
	}

	var ob struct {
		EventID, Type, Topic, Key string
		Payload                   []byte
		Published                 sql.NullTime
	}
	if n := count(t, d.DB, `SELECT COUNT(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
	if err := d.DB.QueryRow(`SELECT event_id, event_type, topic, msg_key, payload, published_at FROM outbox`).
		Scan(&ob.EventID, &ob.Type, &ob.Topic, &ob.Key, &ob.Payload, &ob.Published); err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	wantEventID := coupon.EventID(coupon.EventGranted, o.OrderID, cfg.CampaignID)
	if ob.EventID != wantEventID || ob.Type != coupon.EventGranted || ob.Topic != cfg.GrantedTopic || ob.Key != o.OrderID || ob.Published.Valid {
		t.Errorf("outbox row %+v, want event %s type %s topic %s key %s unpublished", ob, wantEventID, coupon.EventGranted, cfg.GrantedTopic, o.OrderID)
	}
	var ev coupon.GrantEvent
	if err := json.Unmarshal(ob.Payload, &ev); err != nil {
		t.Fatalf("outbox payload %s: %v", ob.Payload, err)
	}
	if ev.EventID != wantEventID || ev.OrderID != o.OrderID || ev.UserID != o.UserID || ev.CampaignID != cfg.CampaignID ||
		ev.CouponID != couponID || ev.ValueCents != valueCents || ev.GrantedAt.IsZero() || ev.Reason != "" || !ev.FailedAt.IsZero() {
		t.Errorf("granted event %+v", ev)
	}

	if got := transitions(t, d.DB, o.OrderID, cfg.CampaignID); !equalStrings(got, happyLog) {
		t.Errorf("grant log %v, want %v", got, happyLog)
	}

	// A further step, for a duplicate delivery or a resumed inbox row, is Done and changes
	// nothing.
	before := takeSnapshot(t, d.DB, o.OrderID, cfg.CampaignID)
	for i := 0; i < 3; i++ {
		p, err := step(ctx, d.DB, g, o)
		if err != nil || p != inbox.Done {
			t.Fatalf("step after GRANTED: %v, %v; want Done, nil", p, err)
		}
	}
	if after := takeSnapshot(t, d.DB, o.OrderID, cfg.CampaignID); after != before {
		t.Errorf("steps after GRANTED changed %+v into %+v", before, after)
	}
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Grants != 1 || a.Granted != 1 || a.Coupons != 1 || a.OutboxEvents != 1 || a.InFlight != 0 {
		t.Errorf("audit %+v", a)
	}
}

// gate widens the window between a step's read of the grant state and its writes. The
// first caller of each step waits until a second caller of the same step arrives, for at
// most hold. Code that reads a stale state lets both through and so applies the step
// twice. Code that runs the steps of one order one after another makes the first caller
// wait out hold.
type gate struct {
	hold time.Duration
	mu   sync.Mutex
	seen map[string]int
	open map[string]chan struct{}
}

func newGate(hold time.Duration) *gate {
	return &gate{hold: hold, seen: map[string]int{}, open: map[string]chan struct{}{}}
}

func (g *gate) wait(ctx context.Context, step string) error {
	g.mu.Lock()
	ch, ok := g.open[step]
	if !ok {
		ch = make(chan struct{})
		g.open[step] = ch
	}
	g.seen[step]++
	if g.seen[step] == 2 {
		close(ch)
	}
	g.mu.Unlock()
	t := time.NewTimer(g.hold)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Call implements coupon.ExternalService. The granter calls it between its read of the
// grant and the step's writes.
func (g *gate) Call(ctx context.Context, step, _ string) error { return g.wait(ctx, step) }

// hammer runs n goroutines that each call fn until it reports done. It returns fn's first
// error.
func hammer(n int, fn func() (done bool, err error)) error {
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for attempt := 0; attempt < 1000; attempt++ {
				done, err := fn()
				if err != nil {
					errs <- err
					return
				}
				if done {
					return
				}
			}
			errs <- errors.New("not done after 1000 attempts")
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	return <-errs
}

// naiveDupTail makes the naive step's coupon insert do nothing for an existing coupon on
// PostgreSQL, where a failed insert aborts the transaction. errNaiveDuplicate stands for
// that case.
var (
	naiveDupTail      = map[bool]string{true: " ON CONFLICT DO NOTHING"}[testenv.Dialect().IsPostgres()]
	errNaiveDuplicate = errors.New("coupon exists")
)

// TestGrantConcurrentSameOrder tests the state machine alone as the second line of
// defence. Without an inbox, 50 goroutines step the same order concurrently.
func TestGrantConcurrentSameOrder(t *testing.T) {
	const N = 50
	d := testenv.DB(t, 16, couponSchema)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("granter", func(t *testing.T) {
		cfg := campaign("concurrent", 1000, 1000*valueCents)
		g := setup(t, d.DB, cfg, newGate(200*time.Millisecond))
		o := order("order-concurrent")
		var retries atomic.Int64
		err := hammer(N, func() (bool, error) {
			p, err := step(ctx, d.DB, g, o)
			switch {
			case err == nil:
				return p == inbox.Done, nil
			case errors.Is(err, coupon.ErrStaleState) || dbx.IsLockConflict(err):
				retries.Add(1)
				return false, nil
			}
			return false, err
		})
		if err != nil {
			t.Fatalf("step: %v", err)
		}
		t.Logf("%d goroutines, %d retried steps", N, retries.Load())
		if gr := readGrant(t, d.DB, o.OrderID, cfg.CampaignID); gr.State != coupon.StateGranted || gr.Version != 3 {
			t.Errorf("grant %+v, want GRANTED version 3", gr)
		}
		if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon WHERE campaign_id = ?`, cfg.CampaignID); n != 1 {
			t.Errorf("%d coupons, want 1", n)
		}
		if c, want := readCounters(t, d.DB, cfg.CampaignID), (counters{Locked: 0, Granted: 1, Spent: valueCents}); c != want {
			t.Errorf("counters %+v, want %+v", c, want)
		}
		if got := transitions(t, d.DB, o.OrderID, cfg.CampaignID); !equalStrings(got, happyLog) {
			t.Errorf("grant log %v, want exactly %v", got, happyLog)
		}
		if n := count(t, d.DB, `SELECT COUNT(*) FROM outbox WHERE msg_key = ?`, o.OrderID); n != 1 {
			t.Errorf("%d outbox events, want 1", n)
		}
		mustVerify(t, d.DB, cfg.CampaignID)
	})

	// The same steps as a plain read-then-write must over-count under the same
	// concurrency. They lack the "AND state = ?" guard and the row lock the granter's
	// upsert takes. This shows that the test above can fail.
	t.Run("naive", func(t *testing.T) {
		cfg := campaign("naive", 1000, 1000*valueCents)
		if err := coupon.EnsureCampaign(ctx, d.DB, cfg); err != nil {
			t.Fatal(err)
		}
		o := order("order-naive")
		if _, err := d.DB.Exec(rb(`INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents) VALUES (?, ?, ?, 'INIT', ?)`),
			o.OrderID, cfg.CampaignID, o.UserID, valueCents); err != nil {
			t.Fatal(err)
		}
		gt := newGate(200 * time.Millisecond)
		var failedSteps atomic.Int64
		err := hammer(N, func() (bool, error) {
			done := false
			err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
				var st coupon.State
				if err := tx.QueryRowContext(ctx, rb(`SELECT state FROM coupon_grant WHERE order_id = ? AND campaign_id = ?`),
					o.OrderID, cfg.CampaignID).Scan(&st); err != nil {
					return err
				}
				if st.Terminal() {
					done = true
					return nil
				}
				if err := gt.wait(ctx, st.Step()); err != nil {
					return err
				}
				next := st.Next()
				switch st {
				case coupon.StateInit:
					if _, err := tx.ExecContext(ctx, rb(`UPDATE coupon_stock SET locked = locked + 1 WHERE campaign_id = ? AND shard = 0`), cfg.CampaignID); err != nil {
						return err
					}
				case coupon.StateLocked:
					if _, err := tx.ExecContext(ctx, rb(`UPDATE coupon_budget SET spent_cents = spent_cents + ? WHERE campaign_id = ? AND shard = 0`), valueCents, cfg.CampaignID); err != nil {
						return err
					}
				case coupon.StateBudgetDeducted:
					// On PostgreSQL a duplicate key would abort the transaction. So the
					// insert does nothing instead, and says so by its row count.
					res, err := tx.ExecContext(ctx, rb(`INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES (?, ?, ?, ?, ?)`+naiveDupTail),
						coupon.CouponID(o.OrderID, cfg.CampaignID), o.OrderID, cfg.CampaignID, o.UserID, valueCents)
					if err == nil && naiveDupTail != "" {
						if n, _ := res.RowsAffected(); n == 0 {
							err = errNaiveDuplicate
						}
					}
					switch {
					case dbx.IsDuplicate(err) || errors.Is(err, errNaiveDuplicate):
						// The coupon exists. Naively call the grant GRANTED without touching
						// the stock again. A stale reader may have moved it back.
					case err != nil:
						return err
					default:
						if _, err := tx.ExecContext(ctx, rb(`UPDATE coupon_stock SET locked = locked - 1, granted = granted + 1 WHERE campaign_id = ? AND shard = 0`), cfg.CampaignID); err != nil {
							return err
						}
					}
				}
				_, err := tx.ExecContext(ctx, rb(`UPDATE coupon_grant SET state = ? WHERE order_id = ? AND campaign_id = ?`),
					string(next), o.OrderID, cfg.CampaignID)
				return err
			})
			if err != nil {
				if ctx.Err() != nil {
					return false, err
				}
				failedSteps.Add(1) // deadlock, lock wait...: roll back and go again
				return false, nil
			}
			return done, nil
		})
		if err != nil {
			t.Fatalf("naive step: %v", err)
		}
		c := readCounters(t, d.DB, cfg.CampaignID)
		t.Logf("naive: counters %+v (%d steps rolled back)", c, failedSteps.Load())
		if c.Locked+c.Granted <= 1 && c.Spent <= valueCents {
			t.Fatalf("the naive read-then-write did not over-count (counters %+v): the concurrency test cannot tell right from wrong", c)
		}
		a, err := coupon.Verify(ctx, d.DB, cfg.CampaignID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if !containsInvariant(a.Violations, 3) {
			t.Errorf("Verify did not flag the naive over-count; violations: %q", a.Violations)
		}
	})
}

// TestGrantRepeatedStepAfterLostResponse checks two cases. A step committed, but its
// caller never learned so, after a timeout or a crash after commit, and runs it again. Or
// the step was lost before commit.
func TestGrantRepeatedStepAfterLostResponse(t *testing.T) {
	d := testenv.DB(t, 4, couponSchema)
	ctx := context.Background()
	cfg := campaign("lost", 10, 10*valueCents)
	g := setup(t, d.DB, cfg, nil)

	t.Run("committed steps then retried", func(t *testing.T) {
		o := order("order-committed")
		want := []counters{{1, 0, 0}, {1, 0, valueCents}, {0, 1, valueCents}}
		for i := range want {
			if _, err := step(ctx, d.DB, g, o); err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			// The "retry" of the step just committed runs the next step, never this one again.
			if c := readCounters(t, d.DB, cfg.CampaignID); c != want[i] {
				t.Fatalf("after step %d: counters %+v, want %+v", i+1, c, want[i])
			}
		}
		// Step 3 "timed out but committed". The retry must not lock stock, spend budget or
		// write a coupon again.
		before := takeSnapshot(t, d.DB, o.OrderID, cfg.CampaignID)
		p, err := step(ctx, d.DB, g, o)
		if err != nil || p != inbox.Done {
			t.Fatalf("retried step 3: %v, %v; want Done", p, err)
		}
		if after := takeSnapshot(t, d.DB, o.OrderID, cfg.CampaignID); after != before {
			t.Fatalf("retried step 3 changed %+v into %+v", before, after)
		}
	})

	t.Run("step lost before commit", func(t *testing.T) {
		o := order("order-rolled-back")
		base := readCounters(t, d.DB, cfg.CampaignID)
		for i := 0; i < 3; i++ {
			// Run the step and lose it. The transaction never commits.
			tx, err := d.DB.BeginTx(ctx, dbx.TxOptions)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.Step(ctx, tx, o); err != nil {
				t.Fatalf("step %d: %v", i+1, err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if p, err := step(ctx, d.DB, g, o); err != nil || (i < 2) != (p == inbox.Continue) {
				t.Fatalf("step %d again: %v, %v", i+1, p, err)
			}
		}
		c := readCounters(t, d.DB, cfg.CampaignID)
		if want := (counters{base.Locked, base.Granted + 1, base.Spent + valueCents}); c != want {
			t.Fatalf("counters %+v, want %+v", c, want)
		}
		if got := transitions(t, d.DB, o.OrderID, cfg.CampaignID); !equalStrings(got, happyLog) {
			t.Errorf("grant log %v, want %v", got, happyLog)
		}
	})
	mustVerify(t, d.DB, cfg.CampaignID)
}

func TestGrantStockExhausted(t *testing.T) {
	d := testenv.DB(t, 4, couponSchema)
	ctx := context.Background()
	cfg := campaign("stock-1", 1, 100*valueCents)
	g := setup(t, d.DB, cfg, nil)

	first, second := order("order-first"), order("order-second")
	mustRunToDone(t, d.DB, g, first)
	if gr := readGrant(t, d.DB, first.OrderID, cfg.CampaignID); gr.State != coupon.StateGranted {
		t.Fatalf("first order %s, want GRANTED", gr.State)
	}
	before := readCounters(t, d.DB, cfg.CampaignID)
	if want := (counters{0, 1, valueCents}); before != want {
		t.Fatalf("counters %+v, want %+v", before, want)
	}

	p, err := step(ctx, d.DB, g, second)
	if err != nil || p != inbox.Done {
		t.Fatalf("second order: %v, %v; want Done, nil (a business failure is not a step error)", p, err)
	}
	gr := readGrant(t, d.DB, second.OrderID, cfg.CampaignID)
	if gr.State != coupon.StateFailed || gr.Reason.String != "stock_exhausted" || gr.CouponID.Valid {
		t.Errorf("second grant %+v, want FAILED stock_exhausted without coupon", gr)
	}
	if c := readCounters(t, d.DB, cfg.CampaignID); c != before {
		t.Errorf("counters %+v changed by the failure, want %+v", c, before)
	}
	if got, want := transitions(t, d.DB, second.OrderID, cfg.CampaignID), []string{"INIT->FAILED"}; !equalStrings(got, want) {
		t.Errorf("grant log %v, want %v", got, want)
	}
	checkFailedEvent(t, d.DB, cfg, second, "stock_exhausted")
	if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon`); n != 1 {
		t.Errorf("%d coupons, want 1", n)
	}
	// FAILED is terminal, so a redelivery changes nothing.
	snap := takeSnapshot(t, d.DB, second.OrderID, cfg.CampaignID)
	if p, err := step(ctx, d.DB, g, second); err != nil || p != inbox.Done {
		t.Fatalf("step after FAILED: %v, %v", p, err)
	}
	if after := takeSnapshot(t, d.DB, second.OrderID, cfg.CampaignID); after != snap {
		t.Errorf("step after FAILED changed %+v into %+v", snap, after)
	}
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Granted != 1 || a.Failed != 1 || a.OutboxEvents != 2 {
		t.Errorf("audit %+v", a)
	}
}

func TestGrantBudgetExhausted(t *testing.T) {
	d := testenv.DB(t, 4, couponSchema)
	ctx := context.Background()
	cfg := campaign("budget-1", 10, valueCents)
	g := setup(t, d.DB, cfg, nil)

	first, second := order("order-first"), order("order-second")
	mustRunToDone(t, d.DB, g, first)

	p, err := step(ctx, d.DB, g, second)
	if err != nil || p != inbox.Continue {
		t.Fatalf("second order step 1: %v, %v; want Continue", p, err)
	}
	if gr := readGrant(t, d.DB, second.OrderID, cfg.CampaignID); gr.State != coupon.StateLocked {
		t.Fatalf("second order after step 1: %s, want LOCKED", gr.State)
	}
	if c, want := readCounters(t, d.DB, cfg.CampaignID), (counters{1, 1, valueCents}); c != want {
		t.Fatalf("counters after the lock %+v, want %+v", c, want)
	}
	p, err = step(ctx, d.DB, g, second)
	if err != nil || p != inbox.Done {
		t.Fatalf("second order step 2: %v, %v; want Done, nil", p, err)
	}
	gr := readGrant(t, d.DB, second.OrderID, cfg.CampaignID)
	if gr.State != coupon.StateFailed || gr.Reason.String != "budget_exhausted" {
		t.Errorf("second grant %+v, want FAILED budget_exhausted", gr)
	}
	// The stock lock of the failed grant is released.
	if c, want := readCounters(t, d.DB, cfg.CampaignID), (counters{0, 1, valueCents}); c != want {
		t.Errorf("counters %+v, want %+v (stock lock released)", c, want)
	}
	if got, want := transitions(t, d.DB, second.OrderID, cfg.CampaignID), []string{"INIT->LOCKED", "LOCKED->FAILED"}; !equalStrings(got, want) {
		t.Errorf("grant log %v, want %v", got, want)
	}
	checkFailedEvent(t, d.DB, cfg, second, "budget_exhausted")
	mustVerify(t, d.DB, cfg.CampaignID)
}

func checkFailedEvent(t *testing.T, db *sql.DB, cfg coupon.Config, o coupon.OrderPaid, reason string) {
	t.Helper()
	wantID := coupon.EventID(coupon.EventGrantFailed, o.OrderID, cfg.CampaignID)
	var id, typ, topic string
	var payload []byte
	if err := db.QueryRow(rb(`SELECT event_id, event_type, topic, payload FROM outbox WHERE msg_key = ?`), o.OrderID).
		Scan(&id, &typ, &topic, &payload); err != nil {
		t.Fatalf("failed event of %s: %v", o.OrderID, err)
	}
	var ev coupon.GrantEvent
	if err := json.Unmarshal(payload, &ev); err != nil {
		t.Fatalf("failed event payload %s: %v", payload, err)
	}
	if id != wantID || typ != coupon.EventGrantFailed || topic != cfg.FailedTopic || ev.EventID != wantID ||
		ev.Reason != reason || ev.OrderID != o.OrderID || ev.CouponID != "" || ev.FailedAt.IsZero() || !ev.GrantedAt.IsZero() {
		t.Errorf("failed event id %s type %s topic %s payload %s; want id %s type %s reason %s", id, typ, topic, payload, wantID, coupon.EventGrantFailed, reason)
	}
}

func TestGrantInjectedFailures(t *testing.T) {
	d := testenv.DB(t, 4, couponSchema)
	ctx := context.Background()
	const orders = 10
	cfg := campaign("flaky", 100, 100*valueCents)
	g := setup(t, d.DB, cfg, coupon.NewSimulatedService(0, 0, 0.5, 7))

	injected := 0
	for i := 0; i < orders; i++ {
		o := order(fmt.Sprintf("order-%02d", i))
		for attempt := 0; ; attempt++ {
			if attempt == 1000 {
				t.Fatalf("order %s not done after 1000 steps", o.OrderID)
			}
			p, err := step(ctx, d.DB, g, o)
			if errors.Is(err, coupon.ErrInjected) {
				injected++ // the step's transaction was rolled back
				continue
			}
			if err != nil {
				t.Fatalf("order %s: %v", o.OrderID, err)
			}
			if p == inbox.Done {
				break
			}
		}
		if got := transitions(t, d.DB, o.OrderID, cfg.CampaignID); !equalStrings(got, happyLog) {
			t.Errorf("order %s: grant log %v, want %v", o.OrderID, got, happyLog)
		}
	}
	if injected == 0 {
		t.Fatal("no failure was injected: the test proves nothing")
	}
	t.Logf("%d injected failures over %d orders", injected, orders)
	if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon`); n != orders {
		t.Errorf("%d coupons, want %d", n, orders)
	}
	if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon GROUP BY order_id ORDER BY COUNT(*) DESC LIMIT 1`); n != 1 {
		t.Errorf("an order has %d coupons", n)
	}
	if c, want := readCounters(t, d.DB, cfg.CampaignID), (counters{0, orders, orders * valueCents}); c != want {
		t.Errorf("counters %+v, want %+v", c, want)
	}
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Granted != orders || a.OutboxEvents != orders {
		t.Errorf("audit %+v", a)
	}
}

func containsInvariant(violations []string, n int) bool {
	for _, v := range violations {
		if strings.Contains(v, fmt.Sprintf("invariant %d", n)) {
			return true
		}
	}
	return false
}

func TestVerify(t *testing.T) {
	d := testenv.DB(t, 4, couponSchema)
	ctx := context.Background()
	const orders = 20
	cfg := campaign("verify", 100, 100*valueCents)
	g := setup(t, d.DB, cfg, nil)
	for i := 0; i < orders; i++ {
		mustRunToDone(t, d.DB, g, order(fmt.Sprintf("order-%02d", i)))
	}
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Grants != orders || a.Granted != orders || a.Coupons != orders || a.DuplicateCoupons != 0 ||
		a.OutboxEvents != orders || a.OutboxPending != orders || a.InFlight != 0 {
		t.Fatalf("clean audit %+v", a)
	}

	exec := func(t *testing.T, q string, args ...any) {
		t.Helper()
		if _, err := d.DB.ExecContext(ctx, rb(q), args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	granted := "order-03"

	// These are inbox rows as the entrances leave them. An HTTP claim is done with its
	// grant. A row an operator resolved is done without one, and the audit leaves it out.
	const inboxRow = `INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, metadata, fingerprint, expire_at)
 VALUES (?, ?, 'done', ?, ?, 't', 0, 0, ?, ?, ?, ?)`
	row := func(biz, key, reason, token string) []any {
		var r, md any
		if reason != "" {
			r = reason
		}
		if token != "" {
			md = fmt.Sprintf(`{%q: %q}`, inbox.MetadataIdempotencyKey, token)
		}
		return []any{key, biz, r, "uuid-" + key, []byte("{}"), md, strings.Repeat("0", 64), time.Now().Add(time.Hour).UTC()}
	}
	claimID := coupon.ClaimID("tok-real")
	mustRunToDone(t, d.DB, g, coupon.OrderPaid{OrderID: claimID, UserID: "u-claim", AmountCents: 0, PaidAt: time.Date(2024, 11, 11, 0, 0, 0, 0, time.UTC)})
	exec(t, inboxRow, row(coupon.ClaimBizType, "tok-real", "", "tok-real")...)
	exec(t, inboxRow, row(coupon.BizType, "order-resolved", string(engine.ReasonResolved), "")...)
	mustVerify(t, d.DB, cfg.CampaignID)
	var ob struct {
		ID, Type, Topic string
		Payload         []byte
		Created         time.Time
	}
	if err := d.DB.QueryRow(rb(`SELECT event_id, event_type, topic, payload, created_at FROM outbox WHERE msg_key = ?`), granted).
		Scan(&ob.ID, &ob.Type, &ob.Topic, &ob.Payload, &ob.Created); err != nil {
		t.Fatal(err)
	}

	faults := []struct {
		name      string
		invariant int
		lagBound  time.Duration
		inject    string
		args      []any
		undo      string
		undoArgs  []any
	}{
		{"coupon without a GRANTED grant", 1, time.Hour,
			`INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES (?, 'order-ghost', ?, 'user-ghost', 500)`,
			[]any{coupon.CouponID("order-ghost", cfg.CampaignID), cfg.CampaignID},
			`DELETE FROM user_coupon WHERE order_id = 'order-ghost'`, nil},
		{"stock granted bumped", 3, time.Hour,
			`UPDATE coupon_stock SET granted = granted + 1 WHERE campaign_id = ? AND shard = 0`, []any{cfg.CampaignID},
			`UPDATE coupon_stock SET granted = granted - 1 WHERE campaign_id = ? AND shard = 0`, []any{cfg.CampaignID}},
		{"outbox event of a GRANTED grant deleted", 2, time.Hour,
			`DELETE FROM outbox WHERE msg_key = ?`, []any{granted},
			`INSERT INTO outbox (event_id, event_type, topic, msg_key, payload, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			[]any{ob.ID, ob.Type, ob.Topic, granted, ob.Payload, ob.Created}},
		{"outbox event of a GRANTED grant written twice", 2, time.Hour,
			`INSERT INTO outbox (event_id, event_type, topic, msg_key, payload, created_at, published_at) VALUES ('00000000-0000-0000-0000-000000000002', ?, ?, ?, ?, ?, CURRENT_TIMESTAMP(6))`,
			[]any{ob.Type, ob.Topic, granted, ob.Payload, ob.Created},
			`DELETE FROM outbox WHERE event_id = '00000000-0000-0000-0000-000000000002'`, nil},
		{"done claim row without its grant", 2, time.Hour,
			inboxRow, row(coupon.ClaimBizType, "tok-ghost", "", "tok-ghost"),
			`DELETE FROM inbox WHERE dedup_key = 'tok-ghost'`, nil},
		// The probe's order id is a claim's claimId, and the only grant of that id is the
		// claim's. The order's own grant, named by GrantID, does not exist.
		{"done order whose id is a claim's, without a grant of its own", 2, time.Hour,
			inboxRow, row(coupon.BizType, claimID, "", ""),
			`DELETE FROM inbox WHERE biz_type = ? AND dedup_key = ?`, []any{coupon.BizType, claimID}},
		{"old unpublished outbox row", 4, time.Minute,
			`INSERT INTO outbox (event_id, event_type, topic, msg_key, payload, created_at) VALUES ('00000000-0000-0000-0000-000000000001', 'Other', 'other', 'other-key', ?, ?)`, []any{[]byte("{}"), time.Now().Add(-2 * time.Minute).UTC()},
			`DELETE FROM outbox WHERE msg_key = 'other-key'`, nil},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			exec(t, f.inject, f.args...)
			a, err := coupon.Verify(ctx, d.DB, cfg.CampaignID, f.lagBound)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if a.OK() || !containsInvariant(a.Violations, f.invariant) {
				t.Errorf("fault not caught as invariant %d; violations: %q", f.invariant, a.Violations)
			}
			for _, v := range a.Violations {
				if !strings.Contains(v, fmt.Sprintf("invariant %d", f.invariant)) {
					t.Errorf("unrelated violation: %s", v)
				}
			}
			exec(t, f.undo, f.undoArgs...)
			mustVerify(t, d.DB, cfg.CampaignID)
		})
	}
}

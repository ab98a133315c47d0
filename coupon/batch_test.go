package coupon_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// delivery is one message to push through a Batcher.
type delivery struct {
	key     string
	payload []byte
}

// deliverAll submits every delivery from many goroutines at once, so they meet in batches,
// and returns the outcomes by key.
func deliverAll(t *testing.T, b *engine.Batcher, ds []delivery, goroutines int) map[string][]engine.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var mu sync.Mutex
	out := map[string][]engine.Result{}
	work := make(chan int)
	var wg sync.WaitGroup
	var firstErr error
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				msg := message.NewMessage(watermill.NewUUID(), ds[i].payload)
				r, err := b.Process(ctx, msg, inbox.Source{Topic: "order-paid", Partition: int32(i % 12), Offset: int64(i)})
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				out[ds[i].key] = append(out[ds[i].key], r)
				mu.Unlock()
			}
		}()
	}
	for i := range ds {
		work <- i
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("Process: %v", firstErr)
	}
	return out
}

// bothPaths runs f on the coupon plugin's handler under group commit, with and without
// its HandleBatch. With it, the handler takes the expert path, as the router runs it.
// Without it, the handler has only the contract a plugin author writes.
func bothPaths(t *testing.T, f func(t *testing.T, contract bool)) {
	for _, contract := range []bool{false, true} {
		name := "batch handler"
		if contract {
			name = "contract"
		}
		t.Run(name, func(t *testing.T) { f(t, contract) })
	}
}

// pathHandler is the plugin's handler on db, as plugin builds it. With contract set, it
// hides the handler's HandleBatch.
func pathHandler(t *testing.T, db *sql.DB, g *coupon.Granter, contract bool) inbox.Handler {
	h := plugin(t, db, g)
	if !contract {
		return h
	}
	if p, ok := h.(inbox.Preparer); ok {
		return struct {
			inbox.Handler
			inbox.Preparer
		}{h, p}
	}
	return struct{ inbox.Handler }{h}
}

func newBatcher(t *testing.T, ib *engine.Inbox, cfg engine.BatchConfig) *engine.Batcher {
	t.Helper()
	b, err := ib.NewBatcher(cfg)
	if err != nil {
		t.Fatalf("NewBatcher: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestBatchGrantsExactlyOnce delivers 600 orders three times each, concurrently, through
// the group-commit path, with poison and conflicting payloads mixed in. Each order gets one
// coupon, one event and one logged transition, INIT to GRANTED. The duplicates are
// counted, and the odd messages are quarantined with their reasons. The audit that says so
// catches an injected duplicate event.
func TestBatchGrantsExactlyOnce(t *testing.T) {
	bothPaths(t, func(t *testing.T, contract bool) {
		bothClaimReads(t, func(t *testing.T, sel bool) { testBatchGrantsExactlyOnce(t, sel, contract) })
	})
}

// bothClaimReads runs a test twice. The claim reads its rows back through RETURNING, the
// default on MariaDB, and then through the SELECT other servers use.
func bothClaimReads(t *testing.T, f func(t *testing.T, selectAfterClaim bool)) {
	for _, sel := range []bool{false, true} {
		name := "returning"
		if sel {
			name = "select"
		}
		t.Run(name, func(t *testing.T) { f(t, sel) })
	}
}

func testBatchGrantsExactlyOnce(t *testing.T, sel, contract bool) {
	d := testenv.DB(t, 16, couponSchema)
	ctx := context.Background()
	cfg := campaign("batch-1", 100_000, 100_000*valueCents)
	g := setup(t, d.DB, cfg, nil)
	ib, err := engine.New(d.DB, pathHandler(t, d.DB, g, contract), engine.Config{BizType: coupon.BizType, BackoffInitial: time.Millisecond, BackoffMax: 10 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newBatcher(t, ib, engine.BatchConfig{MaxSize: 64, Workers: 3, SelectAfterClaim: sel})

	const orders, copies = 600, 3
	var ds []delivery
	for i := range orders {
		o := order(fmt.Sprintf("b1-%04d", i))
		for range copies {
			ds = append(ds, delivery{o.OrderID, o.Encode()})
		}
	}
	for i := range 5 {
		ds = append(ds, delivery{fmt.Sprintf("poison-%d", i), []byte("{not json")})
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(ds), func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
	out := deliverAll(t, b, ds, 200)
	// Then the same order ids with another meaning, mixed with more duplicates.
	var late []delivery
	for i := range 5 {
		o := order(fmt.Sprintf("b1-%04d", i))
		late = append(late, delivery{"dup:" + o.OrderID, o.Encode()})
		o.AmountCents++
		late = append(late, delivery{"conflict:" + o.OrderID, o.Encode()})
	}
	for k, rs := range deliverAll(t, b, late, 10) {
		out[k] = rs
	}

	var processed, dup int
	for i := range orders {
		for _, r := range out[fmt.Sprintf("b1-%04d", i)] {
			switch r.Outcome {
			case engine.OutcomeProcessed:
				processed++
			case engine.OutcomeDuplicate:
				dup++
			default:
				t.Errorf("order %d: outcome %+v", i, r)
			}
		}
	}
	if processed != orders || dup != orders*(copies-1) {
		t.Errorf("processed %d duplicates %d, want %d and %d", processed, dup, orders, orders*(copies-1))
	}
	for i := range 5 {
		if r := out[fmt.Sprintf("poison-%d", i)]; len(r) != 1 || r[0].Reason != engine.ReasonPoison {
			t.Errorf("poison %d: %+v, want quarantined as poison", i, r)
		}
		if r := out[fmt.Sprintf("conflict:b1-%04d", i)]; len(r) != 1 || r[0].Reason != engine.ReasonConflict {
			t.Errorf("conflict %d: %+v, want quarantined as conflict", i, r)
		}
		if r := out[fmt.Sprintf("dup:b1-%04d", i)]; len(r) != 1 || r[0].Outcome != engine.OutcomeDuplicate {
			t.Errorf("late duplicate %d: %+v, want a duplicate", i, r)
		}
	}
	st := b.Stats()
	t.Logf("batcher: %+v", st)
	if st.Batches == 0 || st.MaxBatched < 2 || st.Batched < int64(orders) {
		t.Errorf("stats %+v: the deliveries did not share transactions", st)
	}
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Granted != orders || a.Coupons != orders || a.OutboxEvents != orders || a.DuplicatesBlocked != orders*(copies-1)+5 {
		t.Errorf("audit %+v", a)
	}
	want := []string{"INIT->GRANTED"} // the one transition the batch committed
	for _, i := range []int{0, 17, orders - 1} {
		if got := transitions(t, d.DB, fmt.Sprintf("b1-%04d", i), cfg.CampaignID); !equalStrings(got, want) {
			t.Errorf("order %d transitions %v, want %v", i, got, want)
		}
	}

	// The audit can fail. It catches a second event for one order.
	d.AdminExec(t, rb(`INSERT INTO outbox (event_id, event_type, topic, msg_key, payload) VALUES ('00000000-0000-0000-0000-0000000000b1', ?, 'coupon-granted', 'b1-0003', ?)`), coupon.EventGranted, []byte("{}"))
	a, err = coupon.Verify(ctx, d.DB, cfg.CampaignID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !containsInvariant(a.Violations, 2) {
		t.Errorf("an injected duplicate event went unnoticed: %v", a.Violations)
	}
	if st := b.Stats(); st.Returning == sel {
		t.Errorf("claim read back with RETURNING: %v, want %v (MariaDB has it; SelectAfterClaim %v)", st.Returning, !sel, sel)
	}
}

// TestBatchRunsOutOfStockExactly checks a campaign near exhaustion. No shard covers a whole
// batch, so a batch leaves its grants to the one-at-a-time path. Exactly the stock is
// granted, the rest fail as stock_exhausted, and the counters add up.
func TestBatchRunsOutOfStockExactly(t *testing.T) { bothPaths(t, testBatchRunsOutOfStockExactly) }

func testBatchRunsOutOfStockExactly(t *testing.T, contract bool) {
	d := testenv.DB(t, 16, couponSchema)
	cfg := campaign("batch-stock", 300, 1000*valueCents)
	cfg.Shards = 2 // 150 per shard: whole batches fit until the stock runs low
	g := setup(t, d.DB, cfg, nil)
	ib, err := engine.New(d.DB, pathHandler(t, d.DB, g, contract), engine.Config{BizType: coupon.BizType}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newBatcher(t, ib, engine.BatchConfig{MaxSize: 32, Workers: 2})
	var ds []delivery
	for i := range 400 {
		o := order(fmt.Sprintf("bs-%03d", i))
		ds = append(ds, delivery{o.OrderID, o.Encode()})
	}
	deliverAll(t, b, ds, 200)
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Granted != 300 || a.Failed != 100 || a.Coupons != 300 || a.OutboxEvents != 400 {
		t.Errorf("audit %+v, want 300 granted and 100 failed", a)
	}
	st := b.Stats()
	t.Logf("batcher: %+v", st)
	// HandleBatch leaves what it cannot cover whole to the one-at-a-time path. The
	// contract's Handle takes one coupon at a time and fails the rest in the batch.
	if st.Batched == 0 || !contract && st.Fallbacks == 0 {
		t.Errorf("stats %+v: want batched grants (and, with HandleBatch, one-at-a-time ones near exhaustion)", st)
	}
}

// TestBatchFailedCallsFallBack checks that deliveries whose external calls fail before the
// batch are retried one at a time with backoff. Every order ends granted or quarantined,
// never twice.
func TestBatchFailedCallsFallBack(t *testing.T) { bothPaths(t, testBatchFailedCallsFallBack) }

func testBatchFailedCallsFallBack(t *testing.T, contract bool) {
	d := testenv.DB(t, 16, couponSchema)
	cfg := campaign("batch-flaky", 100_000, 100_000*valueCents)
	g := setup(t, d.DB, cfg, coupon.NewSimulatedService(0, time.Millisecond, 0.1, 7))
	ib, err := engine.New(d.DB, pathHandler(t, d.DB, g, contract), engine.Config{BizType: coupon.BizType, BackoffInitial: time.Millisecond, BackoffMax: 5 * time.Millisecond, DelayedRetries: -1}, nil, nil) // quarantined when its attempts run out, not delayed
	if err != nil {
		t.Fatal(err)
	}
	b := newBatcher(t, ib, engine.BatchConfig{MaxSize: 64, Workers: 2})
	const orders = 300
	var ds []delivery
	for i := range orders {
		o := order(fmt.Sprintf("bf-%03d", i))
		ds = append(ds, delivery{o.OrderID, o.Encode()}, delivery{o.OrderID, o.Encode()})
	}
	out := deliverAll(t, b, ds, 100)
	var quarantined int
	for _, rs := range out {
		for _, r := range rs {
			if r.Outcome == engine.OutcomeQuarantined {
				quarantined++
			}
		}
	}
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Granted+int64(quarantined) != orders || a.Coupons != a.Granted {
		t.Errorf("audit %+v with %d quarantined, want every one of %d orders granted or quarantined once", a, quarantined, orders)
	}
	if st := b.Stats(); st.PrepareFailed == 0 {
		t.Errorf("stats %+v: no delivery's calls failed before its batch: the test proves nothing", st)
	}
}

// TestBatchResumesUnfinishedRows checks deliveries whose inbox rows an earlier, crashed
// delivery left 'processing'. One crashed before any step, and one half-way, with its
// grant LOCKED. Each is finished once and not counted as a duplicate.
func TestBatchResumesUnfinishedRows(t *testing.T) {
	bothPaths(t, func(t *testing.T, contract bool) {
		bothClaimReads(t, func(t *testing.T, sel bool) { testBatchResumesUnfinishedRows(t, sel, contract) })
	})
}

func testBatchResumesUnfinishedRows(t *testing.T, sel, contract bool) {
	d := testenv.DB(t, 8, couponSchema)
	ctx := context.Background()
	cfg := campaign("batch-resume", 1000, 1000*valueCents)
	g := setup(t, d.DB, cfg, nil)
	ib, err := engine.New(d.DB, pathHandler(t, d.DB, g, contract), engine.Config{BizType: coupon.BizType}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	early, halfway, fresh := order("br-early"), order("br-halfway"), order("br-fresh")
	for _, o := range []coupon.OrderPaid{early, halfway} {
		d.AdminExec(t, rb(`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, attempts, expire_at)
 VALUES (?, ?, 'processing', 'crashed', 'order-paid', 0, 1, ?, ?, 1, ?)`), o.OrderID, coupon.BizType, o.Encode(), o.Fingerprint(), time.Now().Add(24*time.Hour).UTC())
	}
	if p, err := step(ctx, d.DB, g, halfway); err != nil || p != inbox.Continue {
		t.Fatalf("first step of the half-way order: %v, %v", p, err)
	}
	b := newBatcher(t, ib, engine.BatchConfig{MaxSize: 8, Workers: 1, Linger: 50 * time.Millisecond, SelectAfterClaim: sel})
	out := deliverAll(t, b, []delivery{{early.OrderID, early.Encode()}, {halfway.OrderID, halfway.Encode()}, {fresh.OrderID, fresh.Encode()}}, 3)
	for _, o := range []coupon.OrderPaid{early, halfway, fresh} {
		if r := out[o.OrderID]; len(r) != 1 || r[0].Outcome != engine.OutcomeProcessed {
			t.Errorf("%s: %+v, want processed", o.OrderID, r)
		}
	}
	if n := count(t, d.DB, `SELECT COALESCE(SUM(duplicates), 0) FROM inbox`); n != 0 {
		t.Errorf("%d duplicates counted for resumed deliveries, want 0", n)
	}
	if n := count(t, d.DB, `SELECT COUNT(*) FROM inbox WHERE status = 'done'`); n != 3 {
		t.Errorf("%d inbox rows done, want 3", n)
	}
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Granted != 3 || a.Coupons != 3 {
		t.Errorf("audit %+v", a)
	}
	// The half-way order finishes step by step, and each step is logged. The others either
	// do the same or are granted at once and log the one transition committed. The variant
	// decides which path a resumed delivery takes.
	for _, o := range []coupon.OrderPaid{early, halfway, fresh} {
		got := transitions(t, d.DB, o.OrderID, cfg.CampaignID)
		if !equalStrings(got, happyLog) && (o == halfway || !equalStrings(got, []string{"INIT->GRANTED"})) {
			t.Errorf("%s transitions %v, want %v or, granted at once, [INIT->GRANTED]", o.OrderID, got, happyLog)
		}
	}
}

// TestBatchNewInboxRowsExistingGrants checks new inbox rows whose grants partly exist
// already, as for a message replayed after its inbox row expired. The batch's direct
// GRANTED insert finds them, rolls back to its savepoint and takes the general path. No
// order gets a second coupon, no counter is taken twice, and the half-way grant is
// finished once.
func TestBatchNewInboxRowsExistingGrants(t *testing.T) {
	bothPaths(t, testBatchNewInboxRowsExistingGrants)
}

func testBatchNewInboxRowsExistingGrants(t *testing.T, contract bool) {
	d := testenv.DB(t, 8, couponSchema)
	ctx := context.Background()
	cfg := campaign("batch-existing", 1000, 1000*valueCents)
	g := setup(t, d.DB, cfg, nil)
	ib, err := engine.New(d.DB, pathHandler(t, d.DB, g, contract), engine.Config{BizType: coupon.BizType}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done, halfway, fresh := order("be-done"), order("be-halfway"), order("be-fresh")
	mustRunToDone(t, d.DB, g, done) // granted without the inbox
	if p, err := step(ctx, d.DB, g, halfway); err != nil || p != inbox.Continue {
		t.Fatalf("first step of the half-way order: %v, %v", p, err)
	}
	before := readCounters(t, d.DB, cfg.CampaignID)
	b := newBatcher(t, ib, engine.BatchConfig{MaxSize: 8, Workers: 1, Linger: 50 * time.Millisecond})
	deliverAll(t, b, []delivery{{done.OrderID, done.Encode()}, {halfway.OrderID, halfway.Encode()}, {fresh.OrderID, fresh.Encode()}}, 3)
	a := mustVerify(t, d.DB, cfg.CampaignID)
	if a.Granted != 3 || a.Coupons != 3 || a.OutboxEvents != 3 || a.InboxDone != 3 {
		t.Errorf("audit %+v, want 3 granted, 3 coupons, 3 events, 3 inbox rows done", a)
	}
	after := readCounters(t, d.DB, cfg.CampaignID)
	if got := after.Granted - before.Granted; got != 2 {
		t.Errorf("stock granted grew by %d, want 2 (the half-way and the new order)", got)
	}
}

// TestHandleNewDeliveryOfExistingGrant checks a new delivery, with no inbox row before it,
// of an order whose grant exists already. That happens to a message replayed after its
// inbox row expired. The delivery is Done without a second coupon, and the counters are as
// they were. On PostgreSQL the grant's insert must not fail inside the transaction. It
// would abort the transaction, and the delivery would fail for ever. So the stock and
// budget statement takes nothing for an order whose grant exists.
func TestHandleNewDeliveryOfExistingGrant(t *testing.T) {
	d := testenv.DB(t, 2, couponSchema)
	ctx := context.Background()
	cfg := campaign("existing", 10, 10*valueCents)
	cfg.Shards = 2
	h := plugin(t, d.DB, setup(t, d.DB, cfg, nil))
	o := order("ex-1")
	if _, err := d.DB.Exec(rb(`INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, version, value_cents, stock_shard, budget_shard, coupon_id)
 VALUES (?, ?, ?, 'GRANTED', 3, ?, 0, 0, ?)`), o.OrderID, cfg.CampaignID, o.UserID, valueCents, coupon.CouponID(o.OrderID, cfg.CampaignID)); err != nil {
		t.Fatal(err)
	}
	before := readCounters(t, d.DB, cfg.CampaignID)
	var p inbox.Progress
	err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		var err error
		p, err = h.Handle(ctx, tx, &inbox.Delivery{BizType: coupon.BizType, Key: o.OrderID, Value: o})
		return err
	})
	if err != nil || p != inbox.Done {
		t.Fatalf("Handle: %v %v, want done", p, err)
	}
	if after := readCounters(t, d.DB, cfg.CampaignID); after != before {
		t.Errorf("counters %+v, were %+v", after, before)
	}
	if g := readGrant(t, d.DB, o.OrderID, cfg.CampaignID); g.State != coupon.StateGranted || g.Version != 3 {
		t.Errorf("grant %+v, want GRANTED version 3 as it was", g)
	}
	if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon`) + count(t, d.DB, `SELECT COUNT(*) FROM coupon_grant_log`); n != 0 {
		t.Errorf("%d coupons and transitions written, want none", n)
	}
}

// TestBatchPreparedStatements checks that the batch's grant, log, coupon and outbox inserts
// run as prepared statements of the handler's pool. They are prepared in the background at
// their first use, and the grants are written as without them. The pool has one
// connection, so its session counter counts the batch's executions. Each insert writes 100
// rows as 64 and 32 prepared rows and 4 interpolated ones. So a batch makes 8 prepared
// executions once the statements are prepared. The first batch makes none, because it runs
// while they prepare, and so the check can fail.
func TestBatchPreparedStatements(t *testing.T) {
	d := testenv.DB(t, 1, couponSchema)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := campaign("batch-prep", 100_000, 100_000*valueCents)
	h := plugin(t, d.DB, setup(t, d.DB, cfg, nil)).(inbox.BatchHandler)
	const orders = 100
	execs := func(tx *sql.Tx) int64 {
		var name string
		var n int64
		if err := tx.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_execute'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	batch := func(round int) (prepared int64) {
		ds := make([]*inbox.Delivery, orders)
		for i := range ds {
			o := order(fmt.Sprintf("bp-%02d-%04d", round, i))
			ds[i] = &inbox.Delivery{BizType: coupon.BizType, Key: o.OrderID, Value: o}
		}
		err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
			before := execs(tx)
			progs, err := h.HandleBatch(ctx, tx, ds)
			if err != nil {
				return err
			}
			for i, p := range progs {
				if p != inbox.Done {
					return fmt.Errorf("delivery %d: progress %v, want done", i, p)
				}
			}
			prepared = execs(tx) - before
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return prepared
	}
	rounds := 1
	if n := batch(0); n != 0 {
		t.Fatalf("the first batch: %d prepared executions, want 0 (interpolated while they prepare)", n)
	}
	for ; ; rounds++ {
		n := batch(rounds)
		if n == 8 {
			rounds++
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d prepared executions for 100 grants after %d batches, want 8 (grant, log, coupon and outbox, two each)", n, rounds)
		}
		time.Sleep(10 * time.Millisecond)
	}
	a, err := coupon.Verify(ctx, d.DB, cfg.CampaignID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(orders * rounds)
	if a.Granted != want || a.Coupons != want || a.DuplicateCoupons != 0 || a.OutboxEvents != want || len(a.Violations) != 0 {
		t.Fatalf("audit: %+v, want %d grants", a, want)
	}
	var logRows int64
	if err := d.DB.QueryRowContext(ctx, rb("SELECT COUNT(*) FROM coupon_grant_log WHERE campaign_id = ?"), cfg.CampaignID).Scan(&logRows); err != nil || logRows != want {
		t.Fatalf("transition log rows %d (%v), want %d (one per grant)", logRows, err, want)
	}
}

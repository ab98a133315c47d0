package inbox_test

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

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

var src = inbox.Source{Topic: "order-paid", Partition: 3, Offset: 10233}

// The seed incident: the same order arrives as two different Kafka messages (offsets 10233
// and 10234, different message ids, same meaning).
func TestSameOrderTwoMessagesGrantsOnce(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	ctx := context.Background()
	m1, m2 := orderMsg("20261111-8842", "u1"), orderMsg("20261111-8842", "u1")
	if m1.UUID == m2.UUID {
		t.Fatal("the two deliveries must be different messages")
	}
	r1, err := p.inbox.Process(ctx, m1, src, inbox.ProcessOptions{})
	if err != nil || r1.Outcome != inbox.OutcomeProcessed {
		t.Fatalf("first delivery: %+v %v", r1, err)
	}
	src2 := src
	src2.Offset++
	r2, err := p.inbox.Process(ctx, m2, src2, inbox.ProcessOptions{})
	if err != nil || r2.Outcome != inbox.OutcomeDuplicate {
		t.Fatalf("second delivery: %+v %v", r2, err)
	}
	db := p.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = ?", "20261111-8842"); n != 1 {
		t.Fatalf("coupons = %d, want 1", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox WHERE msg_key = ?", "20261111-8842"); n != 1 {
		t.Fatalf("grant events = %d, want 1", n)
	}
	if n := count(t, db, "SELECT duplicates FROM inbox WHERE dedup_key = ?", "20261111-8842"); n != 1 {
		t.Fatalf("duplicates counted = %d, want 1", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'done'"); n != 1 {
		t.Fatalf("done inbox rows = %d, want 1", n)
	}
}

// naiveGrant is the pre-incident consumer: SELECT to check, then INSERT, no unique key.
func naiveGrant(ctx context.Context, db *sql.DB, orderID string) error {
	var n int
	if err := db.QueryRowContext(ctx, testenv.Rebind("SELECT COUNT(*) FROM naive_coupon WHERE order_id = ?"), orderID).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	time.Sleep(time.Millisecond) // the external call of the seed; widens nothing the real one did not
	_, err := db.ExecContext(ctx, testenv.Rebind("INSERT INTO naive_coupon (order_id) VALUES (?)"), orderID)
	return err
}

// 200 concurrent deliveries of one order, and 1,000 orders delivered concurrently three
// times each: exactly one coupon each. The same load through SELECT-then-INSERT produces
// duplicates, so the assertions can fail.
func TestConcurrentDeliveries(t *testing.T) {
	p := newPipeline(t, pipelineOpts{conns: 64})
	p.db.AdminExec(t, "CREATE TABLE naive_coupon (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(64) NOT NULL)")
	ctx := context.Background()
	db := p.db.DB

	run := func(n int, fn func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := fn(i); err != nil {
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}

	t.Run("200 deliveries of one order", func(t *testing.T) {
		var outcomes sync.Map
		run(200, func(i int) error {
			r, err := p.inbox.Process(ctx, orderMsg("hot-order", "u7"), inbox.Source{Topic: "order-paid", Offset: int64(i)}, inbox.ProcessOptions{})
			if err != nil {
				return err
			}
			v, _ := outcomes.LoadOrStore(r.Outcome, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
			return nil
		})
		if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'hot-order'"); n != 1 {
			t.Fatalf("inbox path: %d coupons, want 1", n)
		}
		if v, _ := outcomes.Load(inbox.OutcomeProcessed); v == nil || v.(*atomic.Int64).Load() != 1 {
			t.Fatalf("processed outcomes: %v, want exactly 1", v)
		}
		if n := count(t, db, "SELECT duplicates FROM inbox WHERE dedup_key = 'hot-order'"); n != 199 {
			t.Fatalf("duplicates blocked = %d, want 199", n)
		}
		run(200, func(int) error { return naiveGrant(ctx, db, "hot-order") })
		naive := count(t, db, "SELECT COUNT(*) FROM naive_coupon WHERE order_id = 'hot-order'")
		t.Logf("SELECT-then-INSERT with 200 concurrent deliveries: %d coupons", naive)
		if naive < 2 {
			t.Fatalf("the naive path produced %d coupons; the test could not have caught a duplicate", naive)
		}
	})

	t.Run("1000 orders three deliveries each", func(t *testing.T) {
		const orders, copies, workers = 1000, 3, 48
		// Each order's copies are queued back to back, so workers run them at the same time.
		queue := func() chan string {
			jobs := make(chan string, orders*copies)
			for i := range orders {
				for range copies {
					jobs <- fmt.Sprintf("bulk-%04d", i)
				}
			}
			close(jobs)
			return jobs
		}
		jobs := queue()
		run(workers, func(int) error {
			for id := range jobs {
				if _, err := p.inbox.Process(ctx, orderMsg(id, "u-"+id), inbox.Source{Topic: "order-paid"}, inbox.ProcessOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
		if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id LIKE 'bulk-%'"); n != orders {
			t.Fatalf("coupons = %d, want %d", n, orders)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM (SELECT order_id FROM user_coupon GROUP BY order_id HAVING COUNT(*) > 1) d"); n != 0 {
			t.Fatalf("%d orders with more than one coupon", n)
		}
		if n := count(t, db, "SELECT COALESCE(SUM(duplicates), 0) FROM inbox WHERE dedup_key LIKE 'bulk-%'"); n != orders*(copies-1) {
			t.Fatalf("duplicates blocked = %d, want %d", n, orders*(copies-1))
		}
		a, err := coupon.Verify(ctx, db, p.cfg.CampaignID, time.Hour)
		if err != nil || !a.OK() {
			t.Fatalf("verify: %v %v", a.Violations, err)
		}

		jobs2 := queue()
		run(workers, func(int) error {
			for id := range jobs2 {
				if err := naiveGrant(ctx, db, id); err != nil {
					return err
				}
			}
			return nil
		})
		dups := count(t, db, "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) n FROM naive_coupon WHERE order_id LIKE 'bulk-%' GROUP BY order_id) d")
		t.Logf("SELECT-then-INSERT, %d orders x %d concurrent deliveries: %d duplicate coupons", orders, copies, dups)
		if dups == 0 {
			t.Fatal("the naive path produced no duplicates; the test could not have caught one")
		}
	})
}

// A failure after the inbox insert rolls everything back; the redelivery grants the coupon.
// In the same test, the seed's first version (dedup mark committed on its own, business
// step after) loses the order.
func TestFailureAfterInboxInsertRollsBack(t *testing.T) {
	var checked atomic.Bool
	var p *pipeline
	p = newPipeline(t, pipelineOpts{wrap: func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if d.Attempt == 1 {
				// Do the real work inside the transaction, then fail.
				if _, err := g.Handle(ctx, tx, d); err != nil {
					return inbox.Continue, err
				}
				return inbox.Continue, errors.New("wallet service timed out")
			}
			if d.Step == 0 {
				// From outside nothing of attempt 1 exists but its count: the inbox row is
				// 'processing' (a row to resume, not a dedup mark) with one failed attempt.
				db := p.db.DB
				if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE dedup_key = ? AND NOT (status = 'processing' AND attempts = 1)", d.Key); n != 0 {
					t.Errorf("inbox rows after the failed attempt other than 'processing' with one attempt: %d, want 0", n)
				}
				if n := count(t, db, "SELECT COUNT(*) FROM coupon_grant WHERE order_id = ?", d.Key); n != 0 {
					t.Errorf("grants after the failed attempt = %d, want 0", n)
				}
				if n := count(t, db, "SELECT SUM(locked) FROM coupon_stock"); n != 0 {
					t.Errorf("stock locked after the failed attempt = %d, want 0", n)
				}
				checked.Store(true)
			}
			return g.Handle(ctx, tx, d)
		}}
	}})
	r, err := p.inbox.Process(context.Background(), orderMsg("o-fail", "u1"), src, inbox.ProcessOptions{})
	if err != nil || r.Outcome != inbox.OutcomeProcessed || r.Attempts != 2 {
		t.Fatalf("result %+v err %v, want processed on attempt 2", r, err)
	}
	if !checked.Load() {
		t.Fatal("the rollback was not observed")
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-fail'"); n != 1 {
		t.Fatalf("coupons = %d, want 1", n)
	}

	// The seed's first version: INSERT IGNORE the mark in its own transaction, then run the
	// step; the step fails; the redelivery sees the mark and skips: the order is lost.
	db := p.db.DB
	p.db.AdminExec(t, "CREATE TABLE naive_dedup (order_id VARCHAR(64) NOT NULL, biz_type VARCHAR(32) NOT NULL, UNIQUE KEY uk_order (order_id, biz_type))")
	naive := func(fail bool) (granted bool) {
		r, err := db.Exec("INSERT IGNORE INTO naive_dedup VALUES ('o-naive', 'coupon')")
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return false // "duplicate": skipped
		}
		return !fail
	}
	first, redelivery := naive(true), naive(false)
	if first || redelivery {
		t.Fatal("expected the naive dedup mark to swallow the redelivery")
	}
	t.Log("naive dedup mark outliving a failed step: the order was never granted (lost)")
}

// A multi-step handler that stops after committing a step (crash, lost partition) leaves a
// 'processing' row; the redelivery resumes where the state machine says, and counts once.
func TestProcessingRowResumes(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	ctx := context.Background()
	// A cancelled delivery (shutdown, lost session) is not acked and records nothing.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.inbox.Process(cctx, orderMsg("o-resume", "u1"), src, inbox.ProcessOptions{}); err == nil {
		t.Fatal("a cancelled context must not be acked")
	}
	// A process that died after committing two steps: the grant is BUDGET_DEDUCTED and the
	// inbox row 'processing'.
	o := coupon.OrderPaid{OrderID: "o-resume", UserID: "u1", AmountCents: 12345, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
	for i := 0; i < 2; i++ {
		if err := dbx.InTx(ctx, p.db.DB, func(tx *sql.Tx) error { _, err := p.granter.Step(ctx, tx, o); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.db.DB.Exec(testenv.Rebind(`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
		VALUES ('o-resume', 'coupon', 'processing', 'x', 'order-paid', 3, 1, ?, ?, CURRENT_TIMESTAMP + INTERVAL '1' DAY)`), o.Encode(), o.Fingerprint()); err != nil {
		t.Fatal(err)
	}
	r, err := p.inbox.Process(ctx, orderMsg("o-resume", "u1"), src, inbox.ProcessOptions{})
	if err != nil || r.Outcome != inbox.OutcomeProcessed {
		t.Fatalf("resume: %+v %v", r, err)
	}
	db := p.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-resume'"); n != 1 {
		t.Fatalf("coupons = %d", n)
	}
	if n := count(t, db, "SELECT SUM(granted) FROM coupon_stock"); n != 1 {
		t.Fatalf("stock granted = %d, want 1", n)
	}
	if n := count(t, db, "SELECT SUM(spent_cents) FROM coupon_budget"); n != int(p.cfg.ValueCents) {
		t.Fatalf("budget spent = %d, want %d (counted once)", n, p.cfg.ValueCents)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM coupon_grant_log WHERE order_id = 'o-resume'"); n != 3 {
		t.Fatalf("transitions = %d, want 3", n)
	}
}

func TestPoisonIsQuarantined(t *testing.T) {
	p := newPipeline(t, pipelineOpts{inboxCfg: inbox.Config{MaxPayloadBytes: 1024}})
	ctx := context.Background()
	cases := []struct {
		name    string
		payload string
		reason  string
	}{
		{"invalid json", `{"orderId": "p1", "userId": `, "unexpected end of JSON input"},
		{"missing orderId", `{"userId": "u1", "amountCents": 1}`, "missing orderId"},
		{"missing userId", `{"orderId": "p2"}`, "missing userId"},
		{"orderId wrong type", `{"orderId": 42, "userId": "u1"}`, "orderId"},
		{"amount wrong type", `{"orderId": "p3", "userId": "u1", "amountCents": "12"}`, "amountCents"},
		{"oversized", `{"orderId": "p4", "userId": "u1", "pad": "` + strings.Repeat("x", 2000) + `"}`, "exceeds the limit"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := inbox.Source{Topic: "order-paid", Partition: 1, Offset: int64(100 + i)}
			r, err := p.inbox.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte(tc.payload)), s, inbox.ProcessOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Outcome != inbox.OutcomeQuarantined || r.Reason != inbox.ReasonPoison || !errors.Is(r.Err, inbox.ErrPoison) {
				t.Fatalf("result %+v", r)
			}
			var status, reason, lastErr string
			var payload []byte
			err = p.db.DB.QueryRow(testenv.Rebind("SELECT status, reason, last_error, payload FROM inbox WHERE dedup_key = ?"),
				fmt.Sprintf("poison:order-paid/1/%d", 100+i)).Scan(&status, &reason, &lastErr, &payload)
			if err != nil {
				t.Fatal(err)
			}
			stored := tc.payload
			if len(stored) > 1024 {
				stored = stored[:1024] // a value over the limit keeps a prefix of the limit's size
			}
			if status != "failed" || reason != "poison" || !strings.Contains(lastErr, tc.reason) || string(payload) != stored {
				t.Fatalf("row status=%s reason=%s last_error=%q", status, reason, lastErr)
			}
		})
	}
	// Nothing else is lost: a good message after the poison is processed.
	if r, err := p.inbox.Process(ctx, orderMsg("good-after-poison", "u1"), src, inbox.ProcessOptions{}); err != nil || r.Outcome != inbox.OutcomeProcessed {
		t.Fatalf("good message: %+v %v", r, err)
	}
}

func TestConflictingPayloadIsQuarantined(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	ctx := context.Background()
	if _, err := p.inbox.Process(ctx, orderMsg("o-conflict", "u1"), src, inbox.ProcessOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := p.inbox.Process(ctx, orderMsg("o-conflict", "someone-else"), src, inbox.ProcessOptions{})
	if err != nil || r.Outcome != inbox.OutcomeConflict || r.Reason != inbox.ReasonConflict {
		t.Fatalf("conflict: %+v %v", r, err)
	}
	db := p.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE dedup_key LIKE 'o-conflict#conflict:%' AND status = 'failed' AND reason = 'conflict'"); n != 1 {
		t.Fatalf("conflict rows = %d, want 1", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-conflict' AND user_id = 'u1'"); n != 1 {
		t.Fatalf("the original grant must stand")
	}
}

func TestRetriesExhaustedQuarantinesAndMovesOn(t *testing.T) {
	var calls atomic.Int64
	p := newPipeline(t, pipelineOpts{inboxCfg: inbox.Config{MaxAttempts: 3}, wrap: func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if d.Key == "o-broken" {
				calls.Add(1)
				return inbox.Continue, errors.New("marketing centre down")
			}
			return g.Handle(ctx, tx, d)
		}}
	}})
	ctx := context.Background()
	r, err := p.inbox.Process(ctx, orderMsg("o-broken", "u1"), src, inbox.ProcessOptions{})
	if err != nil || r.Outcome != inbox.OutcomeQuarantined || r.Reason != inbox.ReasonRetriesExhausted || r.Attempts != 3 {
		t.Fatalf("%+v %v", r, err)
	}
	if calls.Load() != 3 {
		t.Fatalf("handler calls = %d, want 3", calls.Load())
	}
	var status, reason, lastErr string
	var attempts int
	if err := p.db.DB.QueryRow("SELECT status, reason, last_error, attempts FROM inbox WHERE dedup_key = 'o-broken'").Scan(&status, &reason, &lastErr, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || reason != "retries_exhausted" || !strings.Contains(lastErr, "marketing centre down") || attempts != 3 {
		t.Fatalf("row %s %s %q %d", status, reason, lastErr, attempts)
	}
	// A later delivery of the quarantined key is held: counted, not re-run.
	if r, _ := p.inbox.Process(ctx, orderMsg("o-broken", "u1"), src, inbox.ProcessOptions{}); r.Outcome != inbox.OutcomeHeld {
		t.Fatalf("redelivery of a quarantined key: %+v", r)
	}
	// The partition moves on.
	if r, err := p.inbox.Process(ctx, orderMsg("o-next", "u1"), src, inbox.ProcessOptions{}); err != nil || r.Outcome != inbox.OutcomeProcessed {
		t.Fatalf("next: %+v %v", r, err)
	}
	// Reopened (replay after the cause is fixed), it grants exactly once.
	// Reopened by a replay while the cause persists: quarantined again, stamped with the replay.
	r, err = p.inbox.Process(ctx, orderMsg("o-broken", "u1"), src, inbox.ProcessOptions{Reopen: true, ReplayID: 7})
	if err != nil || r.Outcome != inbox.OutcomeQuarantined {
		t.Fatalf("replay while broken: %+v %v", r, err)
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM inbox WHERE dedup_key = 'o-broken' AND replay_id = 7 AND status = 'failed'"); n != 1 {
		t.Fatalf("replayed row not stamped")
	}
}

func TestCleanerDeletesOnlyExpiredDoneRows(t *testing.T) {
	db := testenv.DB(t, 4).DB
	// Rows as the inbox writes them: expire_at = created_at + retention (here 1 day), so
	// receive order is expiry order.
	const day = 24 * 60
	ins := func(key, bizType, status string, minutesAgo int) {
		if _, err := db.Exec(testenv.Rebind(testenv.SQL(`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
			VALUES (?, ?, ?, 'x', 't', 0, 0, '', '', NOW(6) - INTERVAL ? MINUTE, NOW(6) - INTERVAL ? MINUTE + INTERVAL 1 DAY)`,
			`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
			VALUES (?, ?, ?, 'x', 't', 0, 0, '', '', LOCALTIMESTAMP - ? * INTERVAL '1 minute', LOCALTIMESTAMP - ? * INTERVAL '1 minute' + INTERVAL '1 day')`)),
			key, bizType, status, minutesAgo, minutesAgo); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 25 {
		ins(fmt.Sprintf("old-done-%d", i), "coupon", "done", 2*day+i)
	}
	// The cleaner goes biz type by biz type (its index leads with biz_type).
	for i := range 12 {
		ins(fmt.Sprintf("old-done-%d", i), "notify", "done", day+60+i)
	}
	ins("old-processing", "coupon", "processing", 3*day)
	ins("old-failed", "coupon", "failed", 3*day)
	ins("fresh-done", "coupon", "done", 60)
	ins("fresh-done", "notify", "done", 60)
	c, err := inboxops.NewCleaner(db, inbox.CleanerConfig{BatchSize: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.RunOnce(context.Background(), time.Now())
	if err != nil || n != 37 {
		t.Fatalf("deleted %d, err %v; want 37 (25 + 12, in batches of 10)", n, err)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox"); n != 4 {
		t.Fatalf("rows left %d, want 4 (processing, failed, two fresh done)", n)
	}

	// After a retention was shortened: a row received later under the shorter retention is
	// past its expire_at while an older one is not. The cleaner stops at the older one:
	// the later row is deleted late, never an unexpired row early.
	if _, err := db.Exec(testenv.SQL(`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
		VALUES ('short-retention', 'coupon', 'done', 'x', 't', 0, 0, '', '', NOW(6) - INTERVAL 30 MINUTE, NOW(6) - INTERVAL 1 MINUTE)`,
		`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
		VALUES ('short-retention', 'coupon', 'done', 'x', 't', 0, 0, '', '', LOCALTIMESTAMP - INTERVAL '30 minutes', LOCALTIMESTAMP - INTERVAL '1 minute')`)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.RunOnce(context.Background(), time.Now()); err != nil || n != 0 {
		t.Fatalf("deleted %d, err %v; want 0 (fresh-done, received earlier, has not expired)", n, err)
	}
	if _, err := db.Exec("DELETE FROM inbox WHERE dedup_key = 'fresh-done'"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.RunOnce(context.Background(), time.Now()); err != nil || n != 1 {
		t.Fatalf("deleted %d, err %v; want the short-retention row once nothing older is live", n, err)
	}

	// The sweep reads a range of the index in order — no scan, no sort — once there are
	// enough rows for the plan to matter.
	if _, err := db.Exec(testenv.SQL(`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
		SELECT CONCAT('bulk-', seq), 'coupon', ELT(1 + seq % 3, 'done', 'failed', 'processing'), 'x', 't', 0, 0, '', '', NOW() + INTERVAL 1 DAY FROM seq_1_to_5000`,
		`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
		SELECT 'bulk-' || seq, 'coupon', (ARRAY['done', 'failed', 'processing'])[1 + seq % 3], 'x', 't', 0, 0, '', '', LOCALTIMESTAMP + INTERVAL '1 day' FROM generate_series(1, 5000) seq`)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(testenv.SQL("ANALYZE TABLE inbox", "ANALYZE inbox")); err != nil {
		t.Fatal(err)
	}
	typ, key, extra := explainPlan(t, db, "SELECT id, expire_at < CURRENT_TIMESTAMP FROM inbox WHERE biz_type = 'coupon' AND status = 'done' ORDER BY created_at, id LIMIT 10")
	if key != "idx_biz_status_created" || (typ != "ref" && typ != "range") || strings.Contains(extra, "filesort") {
		t.Fatalf("the cleaner's read: type=%s key=%s extra=%q, want a ref or range of idx_biz_status_created without a filesort", typ, key, extra)
	}
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  inbox.Config
		want string
	}{
		{"no biz type", inbox.Config{}, "biz type is empty"},
		{"bad table", inbox.Config{BizType: "x", Table: "inbox; DROP TABLE inbox"}, "invalid inbox table"},
		{"short retention", inbox.Config{BizType: "x", Retention: time.Minute}, "retention 1m0s outside 1h0m0s..87600h0m0s"},
		{"bad backoff", inbox.Config{BizType: "x", BackoffInitial: time.Second, BackoffMax: time.Millisecond}, "not a range"},
		{"huge payload", inbox.Config{BizType: "x", MaxPayloadBytes: 64 << 20}, "max_payload_bytes 67108864 outside 1..16777215"},
		{"steps above max steps", inbox.Config{BizType: "x", MaxSteps: 2, StepsPerTx: 3}, "steps per transaction 3 above max steps 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := inbox.New(&sql.DB{}, handlerFunc{}, tc.cfg, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// StepsPerTx > 1: the whole grant runs in one transaction. Concurrent deliveries still give
// one coupon, and a failure at the last step rolls back the earlier steps of the same
// transaction too (nothing half-done is committed); the retry grants once.
func TestStepsPerTransaction(t *testing.T) {
	var failOnce atomic.Bool
	failOnce.Store(true)
	var p *pipeline
	p = newPipeline(t, pipelineOpts{conns: 32, inboxCfg: inbox.Config{StepsPerTx: 3}, wrap: func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if d.Key == "spt-fail" && d.Step == 2 && failOnce.CompareAndSwap(true, false) {
				return inbox.Continue, errors.New("wallet timed out")
			}
			if d.Key == "spt-fail" && d.Attempt == 2 && d.Step == 0 {
				if n := count(t, p.db.DB, "SELECT COUNT(*) FROM coupon_grant WHERE order_id = 'spt-fail'"); n != 0 {
					t.Errorf("steps 0 and 1 of the failed transaction were committed")
				}
			}
			return g.Handle(ctx, tx, d)
		}}
	}})
	ctx := context.Background()
	r, err := p.inbox.Process(ctx, orderMsg("spt-fail", "u1"), src, inbox.ProcessOptions{})
	if err != nil || r.Outcome != inbox.OutcomeProcessed || r.Attempts != 2 {
		t.Fatalf("%+v %v", r, err)
	}
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.inbox.Process(ctx, orderMsg(fmt.Sprintf("spt-%d", i%10), "u1"), src, inbox.ProcessOptions{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	db := p.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon"); n != 11 {
		t.Fatalf("coupons %d, want 11", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM coupon_grant_log"); n != 33 {
		t.Fatalf("transitions %d, want 33 (3 per order)", n)
	}
	a, err := coupon.Verify(ctx, db, p.cfg.CampaignID, time.Hour)
	if err != nil || !a.OK() {
		t.Fatalf("verify: %v %v", a.Violations, err)
	}
}

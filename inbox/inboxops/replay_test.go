package inboxops_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
)

// failUntilFixed wraps the granter. Every step fails while broken is set, as during an
// outage of the downstream. So the message is quarantined after MaxAttempts.
func failUntilFixed(broken *atomic.Bool) func(inbox.Handler) inbox.Handler {
	return func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if broken.Load() {
				return inbox.Continue, errors.New("wallet service down")
			}
			return g.Handle(ctx, tx, d)
		}}
	}
}

// snapshot is every business and inbox fact a replay could change. strict adds the inbox
// rows' duplicate counters and updated_at, which a duplicate delivery moves, because it is
// counted.
func snapshot(t *testing.T, db *sql.DB, strict bool) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		"SELECT COUNT(*) FROM user_coupon",
		"SELECT COUNT(*) FROM coupon_grant",
		"SELECT COUNT(CASE WHEN state = 'GRANTED' THEN 1 END) FROM coupon_grant",
		"SELECT COUNT(*) FROM outbox",
		"SELECT COALESCE(SUM(locked), 0) FROM coupon_stock",
		"SELECT COALESCE(SUM(granted), 0) FROM coupon_stock",
		"SELECT COALESCE(SUM(spent_cents), 0) FROM coupon_budget",
	} {
		fmt.Fprintf(&b, "%s=%d\n", q, count(t, db, q))
	}
	rows, err := db.Query("SELECT id, dedup_key, status, COALESCE(reason, ''), attempts, COALESCE(replay_id, 0), duplicates, updated_at FROM inbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, attempts, replay, dups int64
		var key, status, reason string
		var updated time.Time
		if err := rows.Scan(&id, &key, &status, &reason, &attempts, &replay, &dups, &updated); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "inbox %d %s %s %s attempts=%d replay=%d", id, key, status, reason, attempts, replay)
		if strict {
			fmt.Fprintf(&b, " duplicates=%d updated=%s", dups, updated.Format(time.RFC3339Nano))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func failedFilter() inboxops.Filter {
	return inboxops.Filter{Statuses: []engine.Status{engine.StatusFailed}}
}

// TestReplayQuarantinedAfterFixGrantsOnce checks the recovery after an outage. An order
// quarantined while the wallet service was down is replayed after the fix, and grants
// exactly one coupon. The replay is recorded, and its id is stamped on the row. A second
// replay finds nothing failed, and a replay of done rows grants nothing.
func TestReplayQuarantinedAfterFixGrantsOnce(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	p := newPipeline(t, pipelineOpts{inboxCfg: engine.Config{MaxAttempts: 2}, wrap: failUntilFixed(&broken)})
	ctx := context.Background()
	db := p.db.DB

	r, err := p.inbox.Process(ctx, orderMsg("o-outage", "u1"), src, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonRetriesExhausted {
		t.Fatalf("during the outage: %+v %v", r, err)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon"); n != 0 {
		t.Fatalf("coupons during the outage = %d", n)
	}

	broken.Store(false) // the cause is fixed
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Selected != 1 || rep.Processed != 1 || rep.Duplicates+rep.Quarantined+rep.Conflicts != 0 || rep.Outcome != inboxops.ReplayOK {
		t.Fatalf("replay report: %+v", rep)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-outage'"); n != 1 {
		t.Fatalf("coupons after replay = %d, want 1", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM outbox WHERE msg_key = 'o-outage'"); n != 1 {
		t.Fatalf("grant events after replay = %d, want 1", n)
	}
	var status string
	var replayID sql.NullInt64
	if err := db.QueryRow("SELECT status, replay_id FROM inbox WHERE dedup_key = 'o-outage'").Scan(&status, &replayID); err != nil {
		t.Fatal(err)
	}
	if status != "done" || replayID.Int64 != rep.ID {
		t.Fatalf("inbox row status=%s replay_id=%v, want done and %d", status, replayID, rep.ID)
	}
	store, err := inboxops.NewStore(db, "")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.LoadReplay(ctx, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Selected != 1 || rec.Processed != 1 || rec.Outcome != inboxops.ReplayOK || rec.DryRun || rec.FinishedAt.IsZero() ||
		rec.BizType != "coupon" || len(rec.Filter.Statuses) != 1 || rec.Filter.Statuses[0] != engine.StatusFailed {
		t.Fatalf("replay record: %+v", rec)
	}
	if rows, err := store.List(ctx, inboxops.Filter{ReplayID: rep.ID}); err != nil || len(rows) != 1 || rows[0].DedupKey != "o-outage" {
		t.Fatalf("rows stamped by replay %d: %+v %v", rep.ID, rows, err)
	}

	again, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter()})
	if err != nil || again.Selected != 0 || again.Outcome != inboxops.ReplayOK {
		t.Fatalf("second replay of failed rows: %+v %v", again, err)
	}
	before := snapshot(t, db, false)
	done, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: inboxops.Filter{Keys: []string{"o-outage"}}})
	if err != nil || done.Selected != 1 || done.Duplicates != 1 || done.WasDone != 1 || done.Processed != 0 {
		t.Fatalf("replay of the done row: %+v %v", done, err)
	}
	if after := snapshot(t, db, false); after != before {
		t.Fatalf("replaying a done row changed state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestReplayDoneGrantsNothing checks that replaying done messages grants nothing. Every
// row comes back as a duplicate.
func TestReplayDoneGrantsNothing(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	ctx := context.Background()
	for i := range 5 {
		if r, err := p.inbox.Process(ctx, orderMsg(fmt.Sprintf("o-done-%d", i), "u1"), src, engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeProcessed {
			t.Fatalf("%+v %v", r, err)
		}
	}
	before := snapshot(t, p.db.DB, false)
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: inboxops.Filter{Statuses: []engine.Status{engine.StatusDone}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Selected != 5 || rep.Duplicates != 5 || rep.WasDone != 5 || rep.Processed != 0 || rep.Outcome != inboxops.ReplayOK {
		t.Fatalf("report: %+v", rep)
	}
	if after := snapshot(t, p.db.DB, false); after != before {
		t.Fatalf("replaying done rows changed state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := count(t, p.db.DB, "SELECT SUM(duplicates) FROM inbox"); n != 5 {
		t.Fatalf("duplicate counters = %d, want 5 (each replayed done row counted once)", n)
	}
}

// TestReplayDryRunChangesNothing checks that --dry-run selects and logs, and changes
// nothing else.
func TestReplayDryRunChangesNothing(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	p := newPipeline(t, pipelineOpts{inboxCfg: engine.Config{MaxAttempts: 1}, wrap: failUntilFixed(&broken)})
	ctx := context.Background()
	for _, id := range []string{"o-dry-1", "o-dry-2"} {
		if r, err := p.inbox.Process(ctx, orderMsg(id, "u1"), src, engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeQuarantined {
			t.Fatalf("%+v %v", r, err)
		}
	}
	broken.Store(false)
	before := snapshot(t, p.db.DB, true)
	var seen []string
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter(), DryRun: true,
		OnRow: func(r inboxops.Row, _ engine.Result) { seen = append(seen, r.DedupKey) }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Selected != 2 || rep.Processed != 0 || rep.Outcome != inboxops.ReplayDryRun || strings.Join(seen, ",") != "o-dry-1,o-dry-2" {
		t.Fatalf("dry run: %+v rows %v", rep, seen)
	}
	if after := snapshot(t, p.db.DB, true); after != before {
		t.Fatalf("dry run changed state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM replay WHERE id = ? AND dry_run = TRUE AND selected = 2 AND outcome = 'dry_run'", rep.ID); n != 1 {
		t.Fatal("dry run not logged in the replay table")
	}
}

// TestReplayPoisonIsQuarantinedAgain checks that poison rows, which cannot be decoded, are
// quarantined again by a replay. The row stays the same, and is stamped.
func TestReplayPoisonIsQuarantinedAgain(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	ctx := context.Background()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId": 42}`))
	if r, err := p.inbox.Process(ctx, msg, inbox.Source{Topic: "order-paid", Partition: 2, Offset: 7}, engine.ProcessOptions{}); err != nil || r.Reason != engine.ReasonPoison {
		t.Fatalf("%+v %v", r, err)
	}
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Selected != 1 || rep.Poison != 1 || rep.Quarantined != 1 || rep.Outcome != inboxops.ReplayPartial {
		t.Fatalf("report: %+v", rep)
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM inbox WHERE dedup_key = 'poison:order-paid/2/7' AND status = 'failed' AND reason = 'poison' AND replay_id = ?", rep.ID); n != 1 {
		t.Fatal("the poison row was not quarantined again in place with the replay id")
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM inbox"); n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}
	// A second replay stamps the row again. --replay-id lists it under the second only,
	// though replay_row lists it under both. --replay-id reads replay_row, because
	// inbox.replay_id has no index.
	again, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter()})
	if err != nil || again.Quarantined != 1 {
		t.Fatalf("second replay: %+v %v", again, err)
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM replay_row WHERE replay_id IN (?, ?)", rep.ID, again.ID); n != 2 {
		t.Fatalf("replay_row entries of the two replays = %d, want 2", n)
	}
	store, err := inboxops.NewStore(p.db.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int64]int{rep.ID: 0, again.ID: 1} {
		rows, err := store.List(ctx, inboxops.Filter{ReplayID: id})
		if err != nil || len(rows) != want {
			t.Fatalf("rows stamped by replay %d: %d (%v), want %d", id, len(rows), err, want)
		}
	}
}

// TestReplayResumesStuckProcessingRow checks that a 'processing' row, left behind by a
// consumer that died between steps, resumes under a replay selected with OlderThan. It
// grants once.
func TestReplayResumesStuckProcessingRow(t *testing.T) {
	var die atomic.Bool
	die.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	p := newPipeline(t, pipelineOpts{wrap: func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			prog, err := g.Handle(ctx, tx, d)
			if die.Load() && d.Step == 1 {
				cancel() // the consumer dies after its first step committed
				return inbox.Continue, context.Canceled
			}
			return prog, err
		}}
	}})
	if _, err := p.inbox.Process(ctx, orderMsg("o-stuck", "u1"), src, engine.ProcessOptions{}); err == nil {
		t.Fatal("expected the delivery to die")
	}
	die.Store(false)
	db := p.db.DB
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE dedup_key = 'o-stuck' AND status = 'processing'"); n != 1 {
		t.Fatal("no stuck processing row")
	}
	time.Sleep(20 * time.Millisecond)
	rep, err := inboxops.Replay(context.Background(), p.inbox, inboxops.ReplayOptions{Filter: inboxops.Filter{
		Statuses: []engine.Status{engine.StatusProcessing}, OlderThan: 10 * time.Millisecond}})
	if err != nil || rep.Selected != 1 || rep.Processed != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-stuck'"); n != 1 {
		t.Fatalf("coupons = %d, want 1", n)
	}
	if n := count(t, db, "SELECT COALESCE(SUM(granted), 0) FROM coupon_stock"); n != 1 {
		t.Fatalf("stock granted = %d, want 1", n)
	}
}

// TestStoreFilters checks the filters by keys, limit, time window and refs. Rows of
// another biz type are never selected.
func TestStoreFilters(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	ctx := context.Background()
	for i := range 6 {
		if _, err := p.inbox.Process(ctx, orderMsg(fmt.Sprintf("o-f-%d", i), "u1"), src, engine.ProcessOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	store, err := inboxops.NewStore(p.db.DB, "inbox")
	if err != nil {
		t.Fatal(err)
	}
	all, err := store.List(ctx, inboxops.Filter{BizType: "coupon"})
	if err != nil || len(all) != 6 {
		t.Fatalf("all: %d %v", len(all), err)
	}
	if string(all[0].Payload) == "" || all[0].Metadata == nil && len(all[0].Payload) == 0 {
		t.Fatalf("row without payload: %+v", all[0])
	}
	now := time.Now()
	cases := []struct {
		name string
		f    inboxops.Filter
		want int
	}{
		{"keys", inboxops.Filter{Keys: []string{"o-f-1", "o-f-3", "nope"}}, 2},
		{"limit", inboxops.Filter{Limit: 4}, 4},
		{"other biz type", inboxops.Filter{BizType: "notify"}, 0},
		{"status done", inboxops.Filter{Statuses: []engine.Status{engine.StatusDone}}, 6},
		{"status failed", failedFilter(), 0},
		{"since an hour ago", inboxops.Filter{Since: now.Add(-time.Hour)}, 6},
		{"until an hour ago", inboxops.Filter{Until: now.Add(-time.Hour)}, 0},
		{"since in the future", inboxops.Filter{Since: now.Add(time.Hour)}, 0},
		{"ref by id", inboxops.Filter{Refs: []string{fmt.Sprint(all[2].ID)}}, 1},
		{"ref by key", inboxops.Filter{Refs: []string{"o-f-5"}}, 1},
		{"older than an hour", inboxops.Filter{OlderThan: time.Hour}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := store.List(ctx, tc.f)
			if err != nil || len(rows) != tc.want {
				t.Fatalf("got %d rows (%v), want %d", len(rows), err, tc.want)
			}
		})
	}
	for _, bad := range []inboxops.Filter{
		{Statuses: []engine.Status{"stuck"}}, {Limit: -1}, {OlderThan: -time.Second},
		{Since: now, Until: now.Add(-time.Hour)}, {Keys: []string{""}},
	} {
		if _, err := store.List(ctx, bad); err == nil {
			t.Errorf("filter %+v accepted", bad)
		}
	}
	if _, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: inboxops.Filter{BizType: "notify"}}); err == nil {
		t.Error("a coupon inbox replayed a notify filter")
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM replay"); n != 0 {
		t.Errorf("rejected replays were recorded: %d", n)
	}
}

// quarantineOrders processes orders while the handler is broken, so each ends 'failed'.
func quarantineOrders(t *testing.T, p *pipeline, broken *atomic.Bool, ids ...string) {
	t.Helper()
	was := broken.Swap(true)
	defer broken.Store(was)
	for _, id := range ids {
		r, err := p.inbox.Process(context.Background(), orderMsg(id, "u-"+id), src, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeQuarantined {
			t.Fatalf("%s: %+v %v, want quarantined", id, r, err)
		}
	}
}

// TestReplayPagesThroughTheSelection checks that a replay reads its selection a page at a
// time. With pages of 2 it replays all 5 failed rows. A row that fails during the replay,
// with an id above the last one at its start, is not selected. The replay table counts
// the 5 rows, and replay_row lists them.
func TestReplayPagesThroughTheSelection(t *testing.T) {
	var broken atomic.Bool
	p := newPipeline(t, pipelineOpts{inboxCfg: engine.Config{MaxAttempts: 1}, wrap: failUntilFixed(&broken)})
	ctx := context.Background()
	quarantineOrders(t, p, &broken, "pg-1", "pg-2", "pg-3", "pg-4", "pg-5")

	var seen []string
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter(), PageSize: 2, OnRow: func(row inboxops.Row, res engine.Result) {
		seen = append(seen, row.DedupKey+"="+string(res.Outcome))
		if len(seen) == 1 {
			quarantineOrders(t, p, &broken, "pg-late") // fails while the replay runs
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := "pg-1=processed pg-2=processed pg-3=processed pg-4=processed pg-5=processed"
	if got := strings.Join(seen, " "); got != want {
		t.Fatalf("replayed %s, want %s", got, want)
	}
	if rep.Selected != 5 || rep.Processed != 5 || rep.Outcome != inboxops.ReplayOK {
		t.Fatalf("report %+v", rep)
	}
	store, err := inboxops.NewStore(p.db.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.LoadReplay(ctx, rep.ID)
	if err != nil || rec.Selected != 5 || rec.Processed != 5 || rec.Outcome != inboxops.ReplayOK {
		t.Fatalf("replay table: %+v %v", rec, err)
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM replay_row WHERE replay_id = ?", rep.ID); n != 5 {
		t.Fatalf("replay_row lists %d rows, want 5", n)
	}
	var status string
	var replayID sql.NullInt64
	if err := p.db.DB.QueryRow("SELECT status, replay_id FROM inbox WHERE dedup_key = 'pg-late'").Scan(&status, &replayID); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || replayID.Valid {
		t.Fatalf("the row that failed during the replay: %s, replay %v; want failed and not replayed", status, replayID)
	}
}

// TestReplayReadsAPageAfterReplayingThePrevious checks that each page is replayed before
// the next is read. A row of the second page fixed by hand while the first page runs no
// longer matches --status failed when its page is read. So it is not selected, though a
// read of all rows at once would have selected it.
func TestReplayReadsAPageAfterReplayingThePrevious(t *testing.T) {
	var broken atomic.Bool
	p := newPipeline(t, pipelineOpts{inboxCfg: engine.Config{MaxAttempts: 1}, wrap: failUntilFixed(&broken)})
	ctx := context.Background()
	quarantineOrders(t, p, &broken, "pp-1", "pp-2", "pp-3", "pp-4", "pp-5")
	var seen []string
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter(), PageSize: 2, OnRow: func(row inboxops.Row, _ engine.Result) {
		seen = append(seen, row.DedupKey)
		if len(seen) == 1 {
			p.db.AdminExec(t, "UPDATE inbox SET status = 'done', reason = NULL WHERE dedup_key = 'pp-4'")
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(seen, " "); got != "pp-1 pp-2 pp-3 pp-5" || rep.Selected != 4 || rep.Processed != 4 {
		t.Fatalf("replayed %s (%+v), want pp-1 pp-2 pp-3 pp-5", got, rep)
	}
}

// TestReplayDryRunPages checks that a dry run pages the same way and counts right. Of 5
// rows, one is done and one poison. In pages of 2, all are listed and nothing changes.
func TestReplayDryRunPages(t *testing.T) {
	var broken atomic.Bool
	p := newPipeline(t, pipelineOpts{inboxCfg: engine.Config{MaxAttempts: 1}, wrap: failUntilFixed(&broken)})
	ctx := context.Background()
	quarantineOrders(t, p, &broken, "dp-1", "dp-2", "dp-3")
	if r, err := p.inbox.Process(ctx, orderMsg("dp-ok", "u1"), src, engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeProcessed {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err := p.inbox.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte("not json")), src, engine.ProcessOptions{}); err != nil || r.Reason != engine.ReasonPoison {
		t.Fatalf("%+v %v", r, err)
	}
	before := snapshot(t, p.db.DB, true)
	var seen int
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{DryRun: true, PageSize: 2, OnRow: func(inboxops.Row, engine.Result) { seen++ }})
	if err != nil {
		t.Fatal(err)
	}
	if seen != 5 || rep.Selected != 5 || rep.WasDone != 1 || rep.Poison != 1 || rep.Processed != 0 || rep.Outcome != inboxops.ReplayDryRun {
		t.Fatalf("dry run: %d rows seen, report %+v", seen, rep)
	}
	if after := snapshot(t, p.db.DB, true); after != before {
		t.Fatalf("a dry run changed:\n%s\nto\n%s", before, after)
	}
}

// TestReplayRefusesRowsThatHoldLessThanTheMessage checks rows that hold less than the
// delivered message. Headers over max_metadata_bytes are stored capped. A value over
// max_payload_bytes is stored as a prefix. A minimal row stores neither. A replay refuses
// each, with its reason, in the dry run and in the replay alike. Nothing runs, and the row
// stays as it was. Each of the three would otherwise run. The capped headers and the
// value's prefix, the order followed by padding, decode as an order.
func TestReplayRefusesRowsThatHoldLessThanTheMessage(t *testing.T) {
	var broken atomic.Bool
	// A permanent failure quarantines at once, with no row before. A row left 'processing'
	// by a counted attempt would keep its content.
	refuse := func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if broken.Load() {
				return inbox.Continue, inbox.Permanent(errors.New("wallet refused"))
			}
			return g.Handle(ctx, tx, d)
		}}
	}
	p := newPipeline(t, pipelineOpts{conns: 4, wrap: refuse})
	ctx := context.Background()
	db := p.db.DB
	deliver := func(msg *message.Message, offset int64) int64 {
		t.Helper()
		r, err := p.inbox.Process(ctx, msg, inbox.Source{Topic: "order-paid", Offset: offset}, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeQuarantined {
			t.Fatalf("offset %d: %+v %v, want quarantined", offset, r, err)
		}
		return r.InboxID
	}
	headers := orderMsg("o-headers", "u1")
	for i := range 70 {
		headers.Metadata.Set(fmt.Sprintf("h%02d", i), strings.Repeat("v", 600))
	}
	big := orderMsg("o-big", "u2")
	big.Payload = append(big.Payload, strings.Repeat(" ", 2<<20)...)
	ids := map[string]int64{"headers": deliver(headers, 1), "value": deliver(big, 2)}
	// The database refuses a quarantined row that carries a payload, so a minimal row is
	// written, as TestQuarantineFallsBackToMinimalRow shows.
	p.db.RefuseQuarantinePayloads(t)
	broken.Store(true)
	ids["minimal"] = deliver(orderMsg("o-minimal", "u3"), 3)
	broken.Store(false) // every cause fixed: a row that ran now would be granted
	p.db.AllowQuarantinePayloads(t)

	store, err := inboxops.NewStore(db, "")
	if err != nil {
		t.Fatal(err)
	}
	why := map[string]string{"headers": "headers are stored cut", "value": "prefix of its", "minimal": "without its value and headers"}
	for name, id := range ids {
		row, err := store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := row.Replayable(); !errors.Is(err, inboxops.ErrNotReplayable) || !strings.Contains(err.Error(), why[name]) {
			t.Errorf("%s row: Replayable() = %v, want not replayable: %s", name, err, why[name])
		}
	}
	before := snapshot(t, db, true)
	for _, dry := range []bool{true, false} {
		got := map[int64]engine.Result{}
		rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: failedFilter(), DryRun: dry, OnRow: func(row inboxops.Row, r engine.Result) { got[row.ID] = r }})
		if err != nil {
			t.Fatal(err)
		}
		want := inboxops.ReplayPartial
		if dry {
			want = inboxops.ReplayDryRun
		}
		if rep.Selected != 3 || rep.Refused != 3 || rep.Processed+rep.Duplicates+rep.Quarantined+rep.Conflicts != 0 || rep.Outcome != want {
			t.Errorf("dry run %v: report %+v, want 3 refused", dry, rep)
		}
		for name, id := range ids {
			if r := got[id]; r.Outcome != engine.OutcomeRefused || !errors.Is(r.Err, inboxops.ErrNotReplayable) || !strings.Contains(r.Err.Error(), why[name]) {
				t.Errorf("dry run %v, %s row: %+v, want refused: %s", dry, name, r, why[name])
			}
		}
		if after := snapshot(t, db, true); after != before {
			t.Fatalf("dry run %v changed the database:\nbefore:\n%s\nafter:\n%s", dry, before, after)
		}
		if loaded, err := store.LoadReplay(ctx, rep.ID); err != nil || loaded.Refused != rep.Refused*map[bool]int{true: 0, false: 1}[dry] {
			t.Errorf("replay %d as loaded: %+v %v", rep.ID, loaded, err)
		}
	}
	if n := count(t, db, "SELECT COUNT(*) FROM user_coupon"); n != 0 {
		t.Fatalf("%d coupons granted from rows that hold less than their message", n)
	}
}

// TestReplayByReason checks that a replay selects by reason. Of three failed rows, the two
// quarantined with retries_exhausted run again, and the one marked panic stays failed. The
// replay table records the reason in its filter.
func TestReplayByReason(t *testing.T) {
	var broken atomic.Bool
	p := newPipeline(t, pipelineOpts{inboxCfg: engine.Config{MaxAttempts: 1}, wrap: failUntilFixed(&broken)})
	ctx := context.Background()
	quarantineOrders(t, p, &broken, "rs-1", "rs-2", "rs-3")
	if _, err := p.db.DB.Exec("UPDATE inbox SET reason = 'panic' WHERE dedup_key = 'rs-2'"); err != nil {
		t.Fatal(err)
	}
	store, err := inboxops.NewStore(p.db.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	f := failedFilter()
	f.Reasons = []engine.Reason{engine.ReasonRetriesExhausted}
	if n, err := store.Count(ctx, f); err != nil || n != 2 {
		t.Fatalf("rows of reason retries_exhausted: %d %v, want 2", n, err)
	}
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: f})
	if err != nil || rep.Selected != 2 || rep.Processed != 2 || rep.Outcome != inboxops.ReplayOK {
		t.Fatalf("replay by reason: %+v %v", rep, err)
	}
	var failed []string
	rows, err := store.List(ctx, failedFilter())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		failed = append(failed, r.DedupKey+"/"+r.Reason)
	}
	if got := strings.Join(failed, " "); got != "rs-2/panic" {
		t.Fatalf("failed after the replay: %s, want rs-2/panic", got)
	}
	rec, err := store.LoadReplay(ctx, rep.ID)
	if err != nil || len(rec.Filter.Reasons) != 1 || rec.Filter.Reasons[0] != engine.ReasonRetriesExhausted {
		t.Fatalf("replay record's filter: %+v %v", rec.Filter, err)
	}
	if err := (inboxops.Filter{Reasons: []engine.Reason{"Panic"}}).Validate(); err == nil {
		t.Fatal("reason Panic accepted")
	}
	// A row waiting for its delayed redelivery is run early by a replay of reason delayed.
	if _, err := p.db.DB.Exec(testenv.Rebind("UPDATE inbox SET reason = 'delayed', retry_at = ? WHERE dedup_key = 'rs-2'"), time.Now().Add(24*time.Hour).UTC()); err != nil {
		t.Fatal(err)
	}
	r, err := inboxops.ParseReason("delayed")
	if err != nil {
		t.Fatal(err)
	}
	f.Reasons = []engine.Reason{r}
	rep, err = inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: f})
	if err != nil || rep.Selected != 1 || rep.Processed != 1 || rep.Outcome != inboxops.ReplayOK {
		t.Fatalf("replay of the delayed row: %+v %v", rep, err)
	}
}

package inboxops_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
)

// seedBrowse inserts n rows of two biz types, and one row in ten is notify. Most are done.
// One in two hundred is failed, with a reason, and one in two hundred processing. The rows
// are received two seconds apart. Every 7th shares its neighbour's time, a tie the id must
// break.
func seedBrowse(t *testing.T, d testenv.Database, n int) {
	t.Helper()
	d.AdminExec(t, testenv.SQL(`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
		SELECT CONCAT('order-', seq), IF(seq % 10 = 0, 'notify', 'coupon'), IF(seq % 200 = 7, 'failed', IF(seq % 200 = 9, 'processing', 'done')),
		       IF(seq % 200 = 7, ELT(1 + seq % 3, 'poison', 'permanent', 'retries_exhausted'), NULL), 'm', 'order-paid', seq % 12, seq,
		       '{"orderId":"x"}', '', TIMESTAMP'2026-11-11 00:00:00' + INTERVAL (seq - seq % 7 DIV 6) * 2 SECOND, TIMESTAMP'2026-12-11 00:00:00'
		FROM seq_1_to_`+strconv.Itoa(n),
		`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
		SELECT 'order-' || seq, CASE WHEN seq % 10 = 0 THEN 'notify' ELSE 'coupon' END,
		       CASE WHEN seq % 200 = 7 THEN 'failed' WHEN seq % 200 = 9 THEN 'processing' ELSE 'done' END,
		       CASE WHEN seq % 200 = 7 THEN (ARRAY['poison', 'permanent', 'retries_exhausted'])[1 + seq % 3] END, 'm', 'order-paid', seq % 12, seq,
		       '{"orderId":"x"}', '', TIMESTAMP '2026-11-11 00:00:00' + (seq - seq % 7 / 6) * 2 * INTERVAL '1 second', TIMESTAMP '2026-12-11 00:00:00'
		FROM generate_series(1, `+strconv.Itoa(n)+`) seq`))
	d.AdminExec(t, testenv.SQL("ANALYZE TABLE inbox", "ANALYZE inbox"))
}

// TestPageWalksEveryRowOnce checks that paging by created_at and id walks every row the
// query selects once, newest first, in either direction. The rows carry no payload.
func TestPageWalksEveryRowOnce(t *testing.T) {
	d := testenv.DB(t, 2)
	seedBrowse(t, d, 3000)
	s, err := inboxops.NewStore(d.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, q := range []inboxops.PageQuery{
		{BizTypes: []string{"coupon", "notify"}},
		{BizTypes: []string{"coupon"}, Statuses: []engine.Status{engine.StatusDone}},
		{BizTypes: []string{"coupon", "notify"}, Statuses: []engine.Status{engine.StatusFailed, engine.StatusProcessing}},
		{BizTypes: []string{"coupon", "notify"}, Reason: "poison"},
		{BizTypes: []string{"coupon", "notify"}, Since: time.Date(2026, 11, 11, 0, 30, 0, 0, time.UTC), Until: time.Date(2026, 11, 11, 1, 0, 0, 0, time.UTC)},
	} {
		var want []int64
		where := "biz_type IN ('" + q.BizTypes[0] + "'" + map[bool]string{true: ", 'notify')", false: ")"}[len(q.BizTypes) > 1]
		switch {
		case q.Reason != "":
			where += " AND status = 'failed' AND reason = '" + q.Reason + "'"
		case len(q.Statuses) == 1:
			where += " AND status = '" + string(q.Statuses[0]) + "'"
		case len(q.Statuses) == 2:
			where += " AND status IN ('failed', 'processing')"
		}
		if !q.Since.IsZero() {
			where += " AND created_at >= '2026-11-11 00:30:00' AND created_at < '2026-11-11 01:00:00'"
		}
		rows, err := d.DB.Query("SELECT id FROM inbox WHERE " + where + " ORDER BY created_at DESC, id DESC")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int64
			_ = rows.Scan(&id)
			want = append(want, id)
		}
		rows.Close()
		if len(want) < 5 {
			t.Fatalf("%+v: only %d rows: the test needs several pages", q, len(want))
		}
		q.Limit = min(len(want)/3, 500) // three pages at least

		var got []int64
		var pages []inboxops.Page
		for p := (inboxops.Page{}); ; {
			q.Before = p.Older
			if p, err = s.Page(ctx, q); err != nil {
				t.Fatal(err)
			}
			pages = append(pages, p)
			for _, r := range p.Rows {
				if len(r.Payload) != 0 || r.Metadata != nil {
					t.Fatalf("row %d of a page carries its payload", r.ID)
				}
				got = append(got, r.ID)
			}
			if p.Older.IsZero() {
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%+v: pages older-ward gave %d rows, want %d in (created_at, id) descending order", q, len(got), len(want))
		}
		// Paging toward newer rows from the last page gives the same pages back.
		q.Before = inboxops.Cursor{}
		for i := len(pages) - 1; i > 0; i-- {
			q.After = pages[i].Newer
			p, err := s.Page(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(p.Rows, pages[i-1].Rows, func(a, b inboxops.Row) bool { return a.ID == b.ID }) {
				t.Fatalf("%+v: the newer page of page %d is not page %d", q, i, i-1)
			}
		}
		q.After = inboxops.Cursor{}
	}
	// A key selects its rows in every biz type, through the unique key.
	p, err := s.Page(ctx, inboxops.PageQuery{BizTypes: []string{"coupon", "notify"}, Keys: []string{"order-7", "order-10", "nope"}, Limit: 10})
	if err != nil || len(p.Rows) != 2 || p.Rows[0].DedupKey != "order-10" || p.Rows[1].Reason == "" {
		t.Fatalf("keys: %+v %v, want order-10 then the failed order-7", p.Rows, err)
	}
	if _, err := s.Get(ctx, 1<<40); !errors.Is(err, inboxops.ErrNoRow) {
		t.Fatalf("Get of a missing id: %v, want ErrNoRow", err)
	}
	if r, err := s.Get(ctx, p.Rows[0].ID); err != nil || string(r.Payload) != `{"orderId":"x"}` {
		t.Fatalf("Get: %q %v, want the row with its payload", r.Payload, err)
	}
}

// TestPageReadsLimitedIndexRanges checks that a page reads one ordered range of the index
// on biz_type, status and created_at per biz type and status. It stops after limit+1
// entries of each, wherever the cursor is. The test checks what the server actually read,
// with ANALYZE, on a table where most rows are done.
func TestPageReadsLimitedIndexRanges(t *testing.T) {
	d := testenv.DB(t, 2)
	seedBrowse(t, d, 60000)
	s, err := inboxops.NewStore(d.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	var failed int
	if err := d.DB.QueryRow("SELECT COUNT(*) FROM inbox WHERE biz_type = 'coupon' AND status = 'failed'").Scan(&failed); err != nil {
		t.Fatal(err)
	}
	mid := inboxops.Cursor{CreatedAt: time.Date(2026, 11, 11, 12, 0, 0, 0, time.UTC), ID: 30000}
	for _, q := range []inboxops.PageQuery{
		{BizTypes: []string{"coupon", "notify"}},
		{BizTypes: []string{"coupon", "notify"}, Before: mid},
		{BizTypes: []string{"coupon", "notify"}, After: mid},
		{BizTypes: []string{"coupon"}, Statuses: []engine.Status{engine.StatusDone}, Before: mid},
		{BizTypes: []string{"coupon", "notify"}, Reason: "permanent"},
		{BizTypes: []string{"coupon", "notify"}, Since: time.Date(2026, 11, 11, 6, 0, 0, 0, time.UTC), Until: time.Date(2026, 11, 11, 18, 0, 0, 0, time.UTC)},
		{BizTypes: []string{"coupon", "notify"}, Keys: []string{"order-77"}},
	} {
		q.Limit = 50
		query, args, err := inboxops.PageSQL(s, q)
		if err != nil {
			t.Fatal(err)
		}
		var plan string
		if err := d.DB.QueryRow(testenv.SQL("ANALYZE FORMAT=JSON ", "EXPLAIN (ANALYZE, FORMAT JSON) ")+query, args...).Scan(&plan); err != nil {
			t.Fatalf("ANALYZE: %v", err)
		}
		var tree any
		if err := json.Unmarshal([]byte(plan), &tree); err != nil {
			t.Fatal(err)
		}
		reads := inboxReads(tree)
		if testenv.Dialect().IsPostgres() {
			reads = pgInboxReads(tree)
		}
		if len(reads) < 2 {
			t.Fatalf("%+v: no read of inbox in the plan:\n%s", q, plan)
		}
		wantKey, most := "idx_biz_status_created", float64(q.Limit+1)
		if len(q.Keys) > 0 {
			wantKey = "uk_dedup"
		}
		if q.Reason != "" {
			// The reason is not in the index. So the failed rows' range is read until the
			// page is full, at most the biz type's failed rows.
			most = float64(failed)
		}
		for _, r := range reads {
			switch {
			case r.table == "i" && (r.key != "PRIMARY" || r.rows > 1):
				t.Errorf("%+v: the page's rows read %v rows per id by key %q, want one by PRIMARY:\n%s", q, r.rows, r.key, plan)
			case r.table == "inbox" && (r.key != wantKey || r.rows > most):
				t.Errorf("%+v: a part read %v rows by key %q, want at most %v by %s:\n%s", q, r.rows, r.key, most, wantKey, plan)
			}
		}
	}
}

type read struct {
	table, key string
	rows       float64
}

// inboxReads finds every access to the inbox table in an ANALYZE FORMAT=JSON plan. The
// table is inbox, or i for the page's rows by id.
func inboxReads(v any) []read {
	var out []read
	switch x := v.(type) {
	case map[string]any:
		if t, _ := x["table_name"].(string); t == "inbox" || t == "i" {
			k, _ := x["key"].(string)
			n, _ := x["r_rows"].(float64)
			out = append(out, read{t, k, n})
		}
		for _, c := range x {
			out = append(out, inboxReads(c)...)
		}
	case []any:
		for _, c := range x {
			out = append(out, inboxReads(c)...)
		}
	}
	return out
}

// pgInboxReads is inboxReads for PostgreSQL's EXPLAIN with ANALYZE and FORMAT JSON, in the
// same terms. It gives the table's alias, inbox or i, and the index read, PRIMARY for the
// primary key's. It gives the rows each read returned per loop.
func pgInboxReads(v any) []read {
	var out []read
	switch x := v.(type) {
	case map[string]any:
		if rel, _ := x["Relation Name"].(string); rel == "inbox" {
			alias, _ := x["Alias"].(string)
			k, _ := x["Index Name"].(string)
			if k == "" { // a bitmap scan: its index is its child's
				if kids, ok := x["Plans"].([]any); ok && len(kids) == 1 {
					k, _ = kids[0].(map[string]any)["Index Name"].(string)
				}
			}
			if k == "inbox_pkey" {
				k = "PRIMARY"
			}
			n, _ := x["Actual Rows"].(float64)
			out = append(out, read{alias, k, n})
		}
		for _, c := range x {
			out = append(out, pgInboxReads(c)...)
		}
	case []any:
		for _, c := range x {
			out = append(out, pgInboxReads(c)...)
		}
	}
	return out
}

package metrics

import (
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestDBGaugesCached checks that the database gauges come from a cache. A burst of scrapes
// runs the queries once, a GROUP BY over the inbox among them. The first scrape already has
// values. The next scrape refreshes a stale cache.
func TestDBGaugesCached(t *testing.T) {
	d := testenv.DB(t, 4)
	d.AdminExec(t, `INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
		VALUES ('k', 'cached', 'done', 'm', 't', 0, 0, '{}', '', CURRENT_TIMESTAMP(6) + INTERVAL '1' DAY)`)
	m := New(d.DB)
	inboxRows := func() float64 {
		t.Helper()
		mfs, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "onceflow_inbox_rows" {
				continue
			}
			for _, x := range mf.GetMetric() {
				for _, l := range x.GetLabel() {
					if l.GetName() == "biz_type" && l.GetValue() == "cached" {
						return x.GetGauge().GetValue()
					}
				}
			}
		}
		return -1
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, err := m.Registry.Gather(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := m.db.queries.Load(); n != 1 {
		t.Fatalf("%d refreshes for 50 scrapes at once, want 1", n)
	}
	if n := inboxRows(); n != 1 {
		t.Fatalf("onceflow_inbox_rows{biz_type=cached} = %v, want 1", n)
	}
	m.db.mu.Lock()
	m.db.cached.At = time.Now().Add(-2 * dbRefresh)
	m.db.mu.Unlock()
	inboxRows()
	for deadline := time.Now().Add(10 * time.Second); m.db.queries.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := m.db.queries.Load(); n != 2 {
		t.Fatalf("%d refreshes after the cache went stale, want 2", n)
	}
}

// TestDBStatsInvalidate checks that after InvalidateDBStats the next read waits for figures
// read after it. A row failed by hand shows at once, not up to dbRefresh later. Without the
// invalidation the fresh cache serves the old count.
func TestDBStatsInvalidate(t *testing.T) {
	d := testenv.DB(t, 4)
	insert := func(key, status string) {
		d.AdminExec(t, `INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, last_error, expire_at)
		VALUES ('`+key+`', 'inv', '`+status+`', 'retries_exhausted', 'm', 't', 0, 0, '{}', '', 'injected external failure: lock_stock (`+key+`:lock_stock)', CURRENT_TIMESTAMP(6) + INTERVAL '1' DAY)`)
	}
	failed := func(s DBStats) int64 {
		for _, r := range s.InboxRows {
			if r.BizType == "inv" && r.Status == "failed" {
				return r.Rows
			}
		}
		return 0
	}
	insert("o-1", "failed")
	m := New(d.DB)
	if n := failed(m.DBStats()); n != 1 {
		t.Fatalf("failed = %d, want 1", n)
	}
	insert("o-2", "failed")
	if n := failed(m.DBStats()); n != 1 {
		t.Fatalf("a fresh cache read again: failed = %d", n)
	}
	m.InvalidateDBStats()
	s := m.DBStats()
	if n := failed(s); n != 2 {
		t.Fatalf("after the invalidation failed = %d, want 2", n)
	}
	if len(s.FailedErrors) != 1 || s.FailedErrors[0] != (ErrorCount{BizType: "inv", Error: "injected external failure: lock_stock (…:lock_stock)", Rows: 2, Of: 2}) {
		t.Fatalf("failed errors: %+v", s.FailedErrors)
	}
}

// TestFailedErrorsPlan checks that the grouping of the last errors reads the newest end of
// the index range of biz_type and 'failed' in index order, not the table. It does not sort
// the failed rows. Only MariaDB's planner is checked. The Makefile's PostgreSQL pass leaves
// the test out by PG_ONLY_MARIADB.
func TestFailedErrorsPlan(t *testing.T) {
	d := testenv.DB(t, 4)
	rows, err := d.DB.Query("EXPLAIN "+failedErrorQuery, "inv")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var plan []string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i, c := range cols {
			fmt.Fprintf(&b, "%s=%s ", c, vals[i].String)
		}
		plan = append(plan, b.String())
	}
	t.Logf("plan:\n%s", strings.Join(plan, "\n"))
	var inner string
	for _, p := range plan {
		if strings.Contains(p, "table=inbox ") {
			inner = p
		}
	}
	if !strings.Contains(inner, "key=idx_biz_status_created ") || strings.Contains(inner, "filesort") {
		t.Fatalf("the inbox is not read by an index range: %s", inner)
	}
}

package metrics

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// tableRows reads inbox_history as a map from "biz minute outcome" to n.
func tableRows(t *testing.T, db *sql.DB) map[string]int64 {
	t.Helper()
	rows, err := db.Query("SELECT biz_type, minute, outcome, n FROM " + HistoryTable)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var biz, outcome string
		var minute time.Time
		var n int64
		if err := rows.Scan(&biz, &minute, &outcome, &n); err != nil {
			t.Fatal(err)
		}
		out[biz+" "+minute.UTC().Format("15:04")+" "+outcome] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func equalCounts(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// observeAt records n deliveries of outcome in minute at, as Observe does at that time.
func observeAt(m *Metrics, biz, outcome string, at time.Time, n int) {
	for range n {
		m.history.add(biz, outcome, at)
	}
}

var t0 = time.Date(2026, 11, 11, 10, 0, 30, 0, time.UTC)

// TestHistoryFlushAddsAcrossRouters has two routers on one database each add their own
// counts. The table holds their sums. An upsert that set n instead of adding would keep one
// router's. A flush with nothing new adds nothing. A later flush adds only what came after
// the previous one. A new process, such as a restart or another router's console, reads the
// same hour.
func TestHistoryFlushAddsAcrossRouters(t *testing.T) {
	d := testenv.DB(t, 4)
	other, err := dbx.Open(context.Background(), testenv.Config(d.DSN, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	a, b := New(d.DB), New(other)
	observeAt(a, "hx", "processed", t0, 5)
	observeAt(a, "hx", "held", t0.Add(time.Minute), 2)
	observeAt(b, "hx", "processed", t0, 3)
	observeAt(b, "hx", "quarantined", t0, 1)
	observeAt(b, "hy", "duplicate", t0, 4)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, m := range []*Metrics{a, b} {
		wg.Go(func() { errs[i] = m.FlushHistory(context.Background()) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"hx 10:00 processed": 8, "hx 10:01 held": 2, "hx 10:00 quarantined": 1, "hy 10:00 duplicate": 4}
	if got := tableRows(t, d.DB); !equalCounts(got, want) {
		t.Fatalf("after both routers' flush: %v, want %v", got, want)
	}
	if err := a.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	observeAt(a, "hx", "processed", t0, 1)
	if err := a.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	want["hx 10:00 processed"] = 9
	if got := tableRows(t, d.DB); !equalCounts(got, want) {
		t.Fatalf("after a flush with nothing new and one more delivery: %v, want %v", got, want)
	}

	restarted := New(d.DB)
	hour, err := restarted.LastHour(context.Background(), []string{"hx"}, t0.Add(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(hour) != 60 || !hour[59].Minute.Equal(time.Date(2026, 11, 11, 10, 2, 0, 0, time.UTC)) {
		t.Fatalf("last hour: %d minutes ending %v, want 60 ending 10:02", len(hour), hour[len(hour)-1].Minute)
	}
	if m := hour[57]; m.Processed != 9 || m.Quarantined != 1 || m.Duplicate != 0 || m.Total() != 10 {
		t.Fatalf("10:00 as a new process reads it: %+v, want 9 processed and 1 quarantined of hx", m)
	}
	if m := hour[58]; m.Held != 2 || m.Total() != 2 {
		t.Fatalf("10:01 as a new process reads it: %+v, want 2 held", m)
	}
	// This process's counts not written yet are added to the table's.
	observeAt(restarted, "hz", "conflict", t0.Add(time.Minute), 1)
	hour, err = restarted.LastHour(context.Background(), []string{"hx"}, t0.Add(2*time.Minute))
	if err != nil || hour[58].Held != 2 || hour[58].Conflict != 1 {
		t.Fatalf("10:01 with an unwritten conflict: %+v %v", hour[58], err)
	}
}

// TestHistoryFailedFlushKeepsCounts checks that a flush that fails keeps its counts, and
// the console still shows them. The next flush writes them once. Here the flush times out
// waiting for a locked row. Its statement is in a transaction never committed. So it is
// rolled back, even when the server runs it after the lock.
func TestHistoryFailedFlushKeepsCounts(t *testing.T) {
	for _, tc := range []struct {
		name        string
		break_, fix func(t *testing.T, d testenv.Database) func()
	}{
		{name: "table renamed", break_: func(t *testing.T, d testenv.Database) func() {
			d.AdminExec(t, "ALTER TABLE "+HistoryTable+" RENAME TO inbox_history_away")
			return func() { d.AdminExec(t, "ALTER TABLE inbox_history_away RENAME TO "+HistoryTable) }
		}},
		{name: "row locked", break_: func(t *testing.T, d testenv.Database) func() {
			// Another transaction inserts a row the flush adds to, and does not commit yet.
			tx, err := d.Admin.Begin()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(testenv.Dialect().Rebind("INSERT INTO "+HistoryTable+" (biz_type, minute, outcome, n) VALUES ('fx', ?, 'processed', 0)"), t0.Truncate(time.Minute)); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testenv.DB(t, 4)
			m := New(d.DB)
			observeAt(m, "fx", "quarantined", t0, 3)
			observeAt(m, "fx", "processed", t0, 2)
			fix := tc.break_(t, d)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := m.FlushHistory(ctx)
			cancel()
			if err == nil {
				fix()
				t.Fatalf("flush with the table %s: no error", tc.name)
			}
			hour, rerr := m.LastHour(context.Background(), []string{"fx"}, t0)
			if hour[59].Quarantined != 3 || hour[59].Processed != 2 {
				t.Errorf("after the failed flush the process shows %+v (%v), want its 3 quarantined and 2 processed", hour[59], rerr)
			}
			observeAt(m, "fx", "quarantined", t0, 1)
			fix()
			if err := m.FlushHistory(context.Background()); err != nil {
				t.Fatalf("flush after the %s table is back: %v", tc.name, err)
			}
			if err := m.FlushHistory(context.Background()); err != nil {
				t.Fatal(err)
			}
			want := map[string]int64{"fx 10:00 quarantined": 4, "fx 10:00 processed": 2}
			if got := tableRows(t, d.DB); !equalCounts(got, want) {
				t.Fatalf("after the failed flush and two more: %v, want %v", got, want)
			}
			hour, err = m.LastHour(context.Background(), []string{"fx"}, t0)
			if err != nil || hour[59].Quarantined != 4 || hour[59].Processed != 2 {
				t.Fatalf("last minute %+v %v, want 4 quarantined and 2 processed", hour[59], err)
			}
		})
	}
}

// TestHistoryFlushedAtShutdown checks that RunHistory flushes once more when it stops. So
// the counts of the last seconds are written.
func TestHistoryFlushedAtShutdown(t *testing.T) {
	d := testenv.DB(t, 4)
	m := New(d.DB)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		m.RunHistory(ctx, time.Hour, func(err error) { runErr = err })
	}()
	observeAt(m, "sx", "processed", t0, 7)
	cancel()
	<-done
	if runErr != nil {
		t.Fatal(runErr)
	}
	if got := tableRows(t, d.DB); !equalCounts(got, map[string]int64{"sx 10:00 processed": 7}) {
		t.Fatalf("after shutdown: %v, want 7 processed", got)
	}
}

// TestHistoryBacklogAndRetention checks that the unwritten backlog is bounded to 24 hours of
// minutes. The oldest minutes are dropped and counted. A flush of more rows than one
// statement takes writes them all. The retention deletes the old minutes in batches and
// keeps the recent ones.
func TestHistoryBacklogAndRetention(t *testing.T) {
	d := testenv.DB(t, 4)
	m := New(d.DB)
	now := time.Now().UTC()
	old := now.Add(-10 * 24 * time.Hour).Truncate(time.Minute)
	for i := range historyBacklog + 100 {
		observeAt(m, "rx", "processed", old.Add(time.Duration(i)*time.Minute), 2)
	}
	var c dto.Metric
	if err := m.history.dropped.Write(&c); err != nil || c.GetCounter().GetValue() != 200 {
		t.Fatalf("dropped %v (%v), want the 100 oldest minutes' 200 deliveries", c.GetCounter().GetValue(), err)
	}
	observeAt(m, "rx", "held", now, 1)
	if err := m.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rows, sum int64
	if err := d.DB.QueryRow("SELECT COUNT(*), SUM(n) FROM "+HistoryTable).Scan(&rows, &sum); err != nil || rows != historyBacklog || sum != 2*historyBacklog-1 {
		// The oldest kept minute made room for the current one.
		t.Fatalf("%d rows summing %d (%v), want %d rows summing %d", rows, sum, err, historyBacklog, 2*historyBacklog-1)
	}
	n, err := m.PruneHistory(context.Background(), now.Add(-HistoryRetention))
	if err != nil || n != historyBacklog-1 {
		t.Fatalf("pruned %d rows (%v), want %d", n, err, historyBacklog-1)
	}
	if got := tableRows(t, d.DB); !equalCounts(got, map[string]int64{"rx " + now.Format("15:04") + " held": 1}) {
		t.Fatalf("after the retention: %v, want the current minute only", got)
	}
}

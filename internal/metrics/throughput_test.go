package metrics

import (
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

// The ring counts deliveries per minute and outcome over the last hour, forgets a minute
// an hour later, and totals everything since the start; Observe feeds it.
func TestThroughputRing(t *testing.T) {
	t0 := time.Date(2026, 11, 11, 10, 0, 30, 0, time.UTC)
	m := New(nil)
	m.throughput = newThroughput(t0)
	tp := m.throughput
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				tp.add("processed", t0)
				tp.add("duplicate", t0.Add(time.Minute))
			}
		})
	}
	wg.Wait()
	tp.add("quarantined", t0.Add(2*time.Minute))
	tp.add("conflict", t0.Add(2*time.Minute))
	tp.add("held", t0.Add(2*time.Minute))
	tp.add("not-an-outcome", t0)

	got := m.Throughput(t0.Add(2 * time.Minute))
	if len(got.Minutes) != 60 {
		t.Fatalf("%d minutes, want 60", len(got.Minutes))
	}
	last := got.Minutes[59]
	if !last.Minute.Equal(time.Date(2026, 11, 11, 10, 2, 0, 0, time.UTC)) || last.Quarantined != 1 || last.Conflict != 1 || last.Held != 1 || last.Total() != 3 {
		t.Fatalf("current minute %+v, want 10:02 with 1 quarantined, 1 conflict and 1 held", last)
	}
	if m := got.Minutes[58]; m.Duplicate != 800 || m.Processed != 0 {
		t.Fatalf("10:01 %+v, want 800 duplicates", m)
	}
	if m := got.Minutes[57]; m.Processed != 800 || m.Total() != 800 {
		t.Fatalf("10:00 %+v, want 800 processed", m)
	}
	if got.Totals.Processed != 800 || got.Totals.Duplicate != 800 || got.Totals.Quarantined != 1 || got.Totals.Conflict != 1 || got.Totals.Held != 1 {
		t.Fatalf("totals %+v", got.Totals)
	}
	// An hour later the old minutes read as zero, even before their buckets are reused,
	// and a reused bucket starts from zero.
	later := m.Throughput(t0.Add(62 * time.Minute))
	for _, c := range later.Minutes {
		if c.Total() != 0 {
			t.Fatalf("an hour later, minute %s still counts %d", c.Minute, c.Total())
		}
	}
	tp.add("processed", t0.Add(60*time.Minute)) // 11:00, the bucket of 10:00
	if c := m.Throughput(t0.Add(60 * time.Minute)).Minutes[59]; c.Processed != 1 {
		t.Fatalf("reused bucket counts %d, want 1", c.Processed)
	}
	// Observe feeds it.
	m.Observe("coupon", "duplicate", time.Millisecond)
	if n := m.Throughput(time.Now()).Totals.Duplicate; n != 801 {
		t.Fatalf("after Observe: %d duplicates in total, want 801", n)
	}
}

// DBStats serves the gauges' cached figures, with the failed rows by reason.
func TestDBStatsReasons(t *testing.T) {
	d := testenv.DB(t, 4)
	d.AdminExec(t, `INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at) VALUES
		('k1', 'st', 'failed', 'poison', 'm', 't', 0, 0, '', '', CURRENT_TIMESTAMP(6) + INTERVAL '1' DAY),
		('k2', 'st', 'failed', 'poison', 'm', 't', 0, 1, '', '', CURRENT_TIMESTAMP(6) + INTERVAL '1' DAY),
		('k3', 'st', 'failed', 'timeout', 'm', 't', 0, 2, '', '', CURRENT_TIMESTAMP(6) + INTERVAL '1' DAY),
		('k4', 'st', 'done', NULL, 'm', 't', 0, 3, '', '', CURRENT_TIMESTAMP(6) + INTERVAL '1' DAY),
		('k5', 'other', 'done', NULL, 'm', 't', 0, 4, '', '', CURRENT_TIMESTAMP(6) + INTERVAL '1' DAY)`)
	m := New(d.DB)
	s := m.DBStats()
	if s.At.IsZero() || !s.OutboxRead || !s.ParkedRead {
		t.Fatalf("stats not read: %+v", s)
	}
	rows := map[string]int64{}
	for _, r := range s.InboxRows {
		rows[r.BizType+"/"+r.Status] = r.Rows
	}
	if rows["st/failed"] != 3 || rows["st/done"] != 1 || rows["other/done"] != 1 {
		t.Fatalf("inbox rows %v", rows)
	}
	reasons := map[string]int64{}
	for _, r := range s.FailedReasons {
		reasons[r.BizType+"/"+r.Reason] = r.Rows
	}
	if len(reasons) != 2 || reasons["st/poison"] != 2 || reasons["st/timeout"] != 1 {
		t.Fatalf("failed by reason %v, want st poison 2, timeout 1", reasons)
	}
	if m.DBStats().At != s.At || m.db.queries.Load() != 1 {
		t.Fatalf("a second read within the refresh interval queried again")
	}
	if s := New(nil).DBStats(); !s.At.IsZero() {
		t.Fatalf("no database: %+v, want zero", s)
	}
}

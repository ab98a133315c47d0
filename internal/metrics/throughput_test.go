package metrics

import (
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

// The totals count every delivery since the start by outcome, concurrently; Observe feeds
// them, and only a Metrics with a database keeps a history.
func TestThroughputTotals(t *testing.T) {
	m := New(nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				m.Observe("coupon", "processed", time.Millisecond)
				m.Observe("coupon", "duplicate", time.Millisecond)
			}
		})
	}
	wg.Wait()
	for _, o := range []string{"quarantined", "conflict", "held", "not-an-outcome"} {
		m.Observe("coupon", o, time.Millisecond)
	}
	got := m.Throughput().Totals
	if got.Processed != 800 || got.Duplicate != 800 || got.Quarantined != 1 || got.Conflict != 1 || got.Held != 1 || got.Total() != 1603 {
		t.Fatalf("totals %+v", got)
	}
	if m.history != nil {
		t.Fatalf("a Metrics without a database keeps a history")
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

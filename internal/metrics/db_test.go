package metrics

import (
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

// The database gauges come from a cache: a burst of scrapes runs the queries (a GROUP BY
// over the inbox among them) once, the first scrape already has values, and a stale cache
// is refreshed by the next scrape.
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

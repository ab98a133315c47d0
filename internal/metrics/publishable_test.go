package metrics

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestPublishableObserve checks when the oldest unpublished row became publishable, read
// after read. A row put back after the previous read counts from that read, not from its
// created_at; rows the reads could not have seen before count from their created_at.
func TestPublishableObserve(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type read struct {
		now  int
		rows []outboxRow
		want int // seconds after t0 the oldest became publishable; -1: none
	}
	row := func(id int64, created int) outboxRow { return outboxRow{id: id, created: at(created)} }
	cases := []struct {
		name  string
		reads []read
	}{
		{"the first read counts from created_at", []read{
			{100, []outboxRow{row(5, 10), row(6, 90)}, 10},
		}},
		{"a row stuck from read to read keeps its time", []read{
			{100, []outboxRow{row(5, 95)}, 95},
			{115, []outboxRow{row(5, 95), row(6, 110)}, 95},
			{130, []outboxRow{row(5, 95)}, 95},
		}},
		{"a row put back by a retry counts from the read before it", []read{
			{100, []outboxRow{row(900, 99)}, 99},
			{115, []outboxRow{row(7, 20), row(8, 21)}, 100},
			{130, []outboxRow{row(7, 20)}, 100},
		}},
		{"none unpublished, then a row put back", []read{
			{100, nil, -1},
			{115, []outboxRow{row(3, 1)}, 100},
		}},
		{"a row created after the previous read counts from its creation", []read{
			{100, nil, -1},
			{115, []outboxRow{row(4, 110)}, 110},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var p publishable
			for i, r := range tc.reads {
				got := p.observe(at(r.now), r.rows)
				switch {
				case r.want < 0 && !got.IsZero():
					t.Fatalf("read %d: publishable since %s, want none", i, got)
				case r.want >= 0 && !got.Equal(at(r.want)):
					t.Fatalf("read %d: publishable since +%s, want +%ds", i, got.Sub(t0), r.want)
				}
			}
		})
	}
}

// TestPublishableFullWindow checks that past a full window rows count from their
// created_at: the previous read did not see them, so they may have been unpublished then.
func TestPublishableFullWindow(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	var p publishable
	full := make([]outboxRow, publishableWindow)
	for i := range full {
		full[i] = outboxRow{id: int64(i + 1), created: t0.Add(50 * time.Second)}
	}
	p.observe(t0.Add(100*time.Second), full)
	// The first half is published; the next rows come into the window. One older than the
	// previous read, past the window's last id, counts from its created_at.
	next := append([]outboxRow(nil), full[publishableWindow/2:]...)
	next = append(next, outboxRow{id: publishableWindow + 1, created: t0.Add(10 * time.Second)})
	if got := p.observe(t0.Add(115*time.Second), next); !got.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("a row past the full window: publishable since +%s, want +10s (its created_at)", got.Sub(t0))
	}
}

// TestOutboxPublishableGauge reads the gauges from a database: a row put back by `router
// outbox retry` with its old created_at ages onceflow_outbox_oldest_unpublished_seconds at
// once, and onceflow_outbox_oldest_publishable_seconds from the read before it.
// onceflow_inbox_failed_rows counts the quarantined rows by reason, not the delayed ones.
func TestOutboxPublishableGauge(t *testing.T) {
	d := testenv.DB(t, 4)
	m := New(d.DB)
	gauge := func(name string) float64 {
		t.Helper()
		m.InvalidateDBStats()
		mfs, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}
	if a := gauge("onceflow_outbox_oldest_publishable_seconds"); a != 0 {
		t.Fatalf("empty outbox: publishable age %v, want 0", a)
	}
	d.AdminExec(t, testenv.Rebind(`INSERT INTO outbox (id, event_id, event_type, topic, msg_key, payload, created_at)
		VALUES (7, 'e-7', 'T', 'topic', 'k', 'p', ?)`), time.Now().Add(-10*time.Minute).UTC())
	if a := gauge("onceflow_outbox_oldest_unpublished_seconds"); a < 590 {
		t.Fatalf("oldest unpublished %v s, want about 600 (from created_at)", a)
	}
	if a := gauge("onceflow_outbox_oldest_publishable_seconds"); a > 30 {
		t.Fatalf("a row put back after the previous read: publishable for %v s, want a few", a)
	}
	time.Sleep(1100 * time.Millisecond)
	if a := gauge("onceflow_outbox_oldest_publishable_seconds"); a < 1 || a > 30 {
		t.Fatalf("the same row a second later: publishable for %v s, want it to keep ageing from the first read", a)
	}

	for i, reason := range []string{"poison", "poison", "delayed", "retries_exhausted"} {
		d.AdminExec(t, testenv.Rebind(`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
		VALUES (?, 'fr', 'failed', ?, 'm', 't', 0, ?, '{}', '', ?)`), "k-"+reason+string(rune('a'+i)), reason, i, time.Now().Add(24*time.Hour).UTC())
	}
	m.InvalidateDBStats()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "onceflow_inbox_failed_rows" {
			continue
		}
		for _, x := range mf.GetMetric() {
			var biz, reason string
			for _, l := range x.GetLabel() {
				switch l.GetName() {
				case "biz_type":
					biz = l.GetValue()
				case "reason":
					reason = l.GetValue()
				}
			}
			got[biz+"/"+reason] = x.GetGauge().GetValue()
		}
	}
	if len(got) != 2 || got["fr/poison"] != 2 || got["fr/retries_exhausted"] != 1 {
		t.Fatalf("onceflow_inbox_failed_rows = %v, want fr/poison 2, fr/retries_exhausted 1 (delayed rows left out)", got)
	}
}

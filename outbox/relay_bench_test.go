package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// BenchmarkEOSRelayPublish measures the exactly-once relay's read-and-send path: b.N rows
// are inserted before the timer starts, then RelayOnce publishes them (batches of 2000, or
// 64, a Kafka transaction each, marked before it returns). An op is one event; allocs/event and
// B/event count every allocation of the process meanwhile (Sarama's goroutines included).
// Run it with a fixed count, e.g. -benchtime=20000x, so the batches are the same every run.
func BenchmarkEOSRelayPublish(b *testing.B) {
	testenv.Integration(b)
	payload := []byte(`{"event_id":"0b6f9d1e-5c3a-4f0e-9a51-2f6c1d8e7a40","order_id":"order-000000123","user_id":"user-42","coupon_id":"WELCOME10","granted_at":"2026-01-02T03:04:05.123456Z"}`)
	for _, tc := range []struct {
		name    string
		trace   string
		headers map[string]string
		batch   int // RelayConfig.BatchSize (0: the default, 2000)
	}{
		{name: "plain"},
		{name: "traced_headers", trace: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			headers: map[string]string{"tenant": "acme", "source": "bench"}},
		{name: "plain_batch64", batch: 64}, // small batches, as a relay keeping up with its writers sends
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			d := testenv.DB(b, 8)
			k := testenv.Kafka(b)
			topic := testenv.Topic(b, k, "outbox-bench", 12)
			relay := newEOSRelay(b, d.DB, k, eosConfig(b, k, outbox.RelayConfig{BatchSize: tc.batch}))
			w := newWriter(b)
			event := func(i int) outbox.Event {
				return outbox.Event{ID: fmt.Sprintf("bench-%s-%d", tc.name, i), Type: "CouponGranted", Topic: topic,
					Key: fmt.Sprintf("order-%09d", i), Payload: payload, Headers: tc.headers, TraceParent: tc.trace}
			}
			// The session starts (and the statements are first run) outside the measurement.
			addCommitted(b, ctx, d.DB, w, event(-1))
			if n, err := relay.RelayOnce(ctx); err != nil || n != 1 {
				b.Fatalf("warm-up RelayOnce: %d, %v", n, err)
			}
			const chunk = 1000
			for from := 0; from < b.N; from += chunk {
				evs := make([]outbox.Event, 0, chunk)
				for i := from; i < min(from+chunk, b.N); i++ {
					evs = append(evs, event(i))
				}
				if err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error { return w.AddBatch(ctx, tx, evs) }); err != nil {
					b.Fatalf("add events: %v", err)
				}
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ReportAllocs()
			b.ResetTimer()
			for published := 0; published < b.N; {
				n, err := relay.RelayOnce(ctx)
				if err != nil {
					b.Fatalf("RelayOnce: %v", err)
				}
				if n == 0 {
					b.Fatalf("RelayOnce published nothing with %d of %d events left", b.N-published, b.N)
				}
				published += n
			}
			b.StopTimer()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N), "allocs/event")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N), "B/event")
		})
	}
}

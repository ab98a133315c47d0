package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

// BenchmarkParkedRelease measures how fast the parked events of a deleted topic go back:
// b.N events parked as a topic's deletion leaves them, half refused (one a key) and half
// held behind them (one a key), with 200-byte payloads, inserted before the timer starts.
// retry is RetrySelected by topic, drop is DropSelected by topic, one_by_one is Retry of
// each refused event in turn. An op is one event. Run it with a fixed count, e.g.
// -benchtime=100000x (one_by_one: -benchtime=4000x).
func BenchmarkParkedRelease(b *testing.B) {
	testenv.Integration(b)
	payload := []byte(strings.Repeat("p", 200))
	for _, mode := range []string{"retry", "drop", "one_by_one"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			d := testenv.DB(b, 4)
			const topic = "deleted-topic"
			heads := (b.N + 1) / 2
			const perStmt = 500
			row := "(?, ?, 'T', ?, ?, ?, CURRENT_TIMESTAMP(6), ?, 'kafka refuses it', ?)"
			for start := 0; start < b.N; start += perStmt {
				n := min(perStmt, b.N-start)
				args := make([]any, 0, 7*n)
				for i := start; i < start+n; i++ {
					// Event i is key i's refused event below heads, and key i-heads's held one
					// above: the held events come later, as a topic's later events do.
					key, reason, behind := i, outbox.ReasonUnknownTopic, any(nil)
					if i >= heads {
						key, reason, behind = i-heads, outbox.ReasonHeld, fmt.Sprintf("ev-%d", i-heads)
					}
					args = append(args, i+1, fmt.Sprintf("ev-%d", i), topic, fmt.Sprintf("key-%d", key), payload, reason, behind)
				}
				q := `INSERT INTO outbox_parked (id, event_id, event_type, topic, msg_key, payload, created_at, reason, error, held_behind) VALUES ` +
					row + strings.Repeat(", "+row, n-1)
				if _, err := d.DB.ExecContext(ctx, testenv.Rebind(q), args...); err != nil {
					b.Fatalf("park events: %v", err)
				}
			}
			store, err := outbox.NewParked(d.DB, "")
			if err != nil {
				b.Fatal(err)
			}
			sel := outbox.Selection{Topic: topic}
			b.ResetTimer()
			start := time.Now()
			switch mode {
			case "retry":
				_, err = store.RetrySelected(ctx, sel, nil)
			case "drop":
				_, err = store.DropSelected(ctx, sel, nil)
			case "one_by_one":
				for i := range heads {
					if _, err = store.Retry(ctx, fmt.Sprintf("ev-%d", i)); err != nil {
						break
					}
				}
			}
			took := time.Since(start)
			b.StopTimer()
			if err != nil {
				b.Fatalf("%s: %v", mode, err)
			}
			if n := parkedCount(b, d.DB); n != 0 {
				b.Fatalf("%s left %d events parked", mode, n)
			}
			b.ReportMetric(float64(b.N)/took.Seconds(), "events/s")
		})
	}
}

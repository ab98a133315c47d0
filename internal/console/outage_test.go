package console

import (
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestOverviewShowsTheBreakersLastError checks that the overview's Dependencies block shows
// an open breaker with the error that opened it. It shows a closed breaker without its last
// error.
func TestOverviewShowsTheBreakersLastError(t *testing.T) {
	d := testenv.DB(t, 2)
	m := metrics.New(d.DB)
	now := time.Now()
	m.SetBreaker("refunds", 1, now, now.Add(time.Minute), "refund r-1: refund provider down")
	m.SetBreaker("payouts", 0, now, time.Time{}, "payout p-1: bank <unreachable>")
	_, base := testConsole(t, Config{DB: d.DB, Metrics: m})
	_, page, _ := get(t, browser(t), base+"/")
	i := strings.Index(page, `id="outage"`)
	if i < 0 {
		t.Fatalf("no Dependencies block:\n%s", page)
	}
	block := page[i:]
	if !strings.Contains(block, "last error: refund r-1: refund provider down") {
		t.Errorf("the open breaker's row lacks its last error:\n%s", block)
	}
	if strings.Contains(block, "bank") {
		t.Errorf("the closed breaker's row shows its last error:\n%s", block)
	}
}

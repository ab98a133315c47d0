package console

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
)

// overviewPage reads the overview of a console on d with m's figures.
func overviewPage(t *testing.T, d testenv.Database, m *metrics.Metrics, biz string) string {
	t.Helper()
	_, base := testConsole(t, Config{DB: d.DB, Metrics: m, BizTypes: []BizType{{Name: biz}}})
	code, page, _ := get(t, browser(t), base+"/")
	if code != 200 {
		t.Fatalf("overview: %d:\n%s", code, page)
	}
	return page
}

func observe(m *metrics.Metrics, biz, outcome string, n int) {
	for range n {
		m.Observe(biz, outcome, time.Millisecond)
	}
}

// TestOverviewHistoryAfterRestart checks that after a restart the overview's last hour and
// chart show what the previous process delivered. They read inbox_history, which that
// process wrote. The new process's own figures start from zero. They are its totals since
// the start, as an in-memory count shows them.
func TestOverviewHistoryAfterRestart(t *testing.T) {
	d := testenv.DB(t, 4)
	before := metrics.New(d.DB)
	observe(before, "hr", "quarantined", 3)
	observe(before, "hr", "processed", 4)
	observe(before, "hr", "held", 1)
	if err := before.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}

	after := metrics.New(d.DB)
	if tot := after.Throughput().Totals; tot.Total() != 0 {
		t.Fatalf("a new process's totals %+v, want none", tot)
	}
	page := overviewPage(t, d, after, "hr")
	for _, want := range []string{"Last hour, every router: <strong>4</strong> processed", `id="held-hour" class="bad">1</strong> held`,
		`id="failed-hour">3</strong> quarantined or in conflict`, "<svg"} {
		if !strings.Contains(page, want) {
			t.Errorf("overview after a restart lacks %q", want)
		}
	}
	if !strings.Contains(page, ": 0 processed") {
		t.Errorf("the process's own totals are not 0 after the restart")
	}
	if t.Failed() {
		t.Log(page)
	}
}

// TestOverviewHistoryOfEveryRouter checks that every router's console shows every router's
// deliveries once written, and its own at once.
func TestOverviewHistoryOfEveryRouter(t *testing.T) {
	d := testenv.DB(t, 4)
	a, b := metrics.New(d.DB), metrics.New(d.DB)
	observe(a, "hm", "processed", 2)
	if err := a.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	observe(b, "hm", "processed", 5) // not written yet
	for _, tc := range []struct {
		name string
		m    *metrics.Metrics
		want int
	}{{"b's console: a's written and its own", b, 7}, {"a's console: b's not written yet", a, 2}} {
		if page := overviewPage(t, d, tc.m, "hm"); !strings.Contains(page, fmt.Sprintf("every router: <strong>%d</strong> processed", tc.want)) {
			t.Errorf("%s: want %d processed in the last hour:\n%s", tc.name, tc.want, page)
		}
	}
	if err := b.FlushHistory(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*metrics.Metrics{a, b} {
		if page := overviewPage(t, d, m, "hm"); !strings.Contains(page, "every router: <strong>7</strong> processed") {
			t.Errorf("after both flushed, a console lacks 7 processed:\n%s", page)
		}
	}
}

package consoleui

import (
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/metrics"
)

func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"order-1":                 "order-1",
		"a\x1b[31mred\x1b[0m":     `a\x1b[31mred\x1b[0m`,
		"line\nbreak\ttab\r":      `line\nbreak\ttab\r`,
		"rtl\u202egnp.exe\u2066x": `rtl\u202egnp.exe\u2066x`,
		"bad \xff\xfe utf8":       `bad \xff\xfe utf8`,
		"c1 \u0085 del \x7f":      `c1 \u0085 del \x7f`,
		"émoji 👍 and 中文 stay":     "émoji 👍 and 中文 stay",
	} {
		if got := Visible(in); got != want {
			t.Errorf("Visible(%q) = %q, want %q", in, got, want)
		}
	}
	if got := VisibleText("a\nb\tc\x1b"); got != "a\nb\tc\\x1b" {
		t.Errorf("visibleText keeps line breaks and tabs only: %q", got)
	}
}

func TestViewPayload(t *testing.T) {
	v := ViewPayload([]byte(`{"b":1,"a":"<x>\u001b"}`), 0, false)
	if !v.JSON || v.Text != "{\n  \"b\": 1,\n  \"a\": \"<x>\\u001b\"\n}" {
		t.Errorf("JSON not pretty-printed as is: %+v", v)
	}
	v = ViewPayload([]byte("plain \x1b text"), 0, false)
	if v.JSON || v.Text != `plain \x1b text` {
		t.Errorf("text: %+v", v)
	}
	big := []byte(strings.Repeat("é", payloadCap)) // 2 bytes each: cut inside a character
	v = ViewPayload(big, 0, false)
	if v.Size != len(big) || v.Shown > payloadCap || v.Shown < payloadCap-1 || strings.ContainsRune(v.Text, '\uFFFD') {
		t.Errorf("capped text: size %d shown %d", v.Size, v.Shown)
	}
	v = ViewPayload([]byte{0xff, 0x00, 'a'}, 0, false)
	if v.Hex == "" || v.Text != "" || !strings.Contains(v.Hex, "ff 00 61") {
		t.Errorf("binary: %+v", v)
	}
	if v := ViewPayload(nil, 0, true); !v.Tombstone || v.Text != "" {
		t.Errorf("tombstone: %+v", v)
	}
}

func TestFormats(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0s", 850 * time.Millisecond: "850ms", 42 * time.Second: "42s",
		190 * time.Second: "3m10s", 125 * time.Minute: "2h05m", 76 * time.Hour: "3d04h"} {
		if got := age(d); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1234: "-1,234"} {
		if got := num(n); got != want {
			t.Errorf("num(%d) = %q, want %q", n, got, want)
		}
	}
}

// The chart: one bar per minute, scaled to the busiest, segments stacked from the base.
func TestChart(t *testing.T) {
	minutes := make([]metrics.MinuteCount, 60)
	minutes[59] = metrics.MinuteCount{Processed: 60, Duplicate: 20, Held: 10, Quarantined: 5, Conflict: 5}
	minutes[30] = metrics.MinuteCount{Processed: 50}
	c := NewChart(minutes)
	if len(c.Bars) != 60 || c.Max != 100 || len(c.Ticks) != 3 {
		t.Fatalf("chart: %d bars, max %d, %d ticks", len(c.Bars), c.Max, len(c.Ticks))
	}
	last := c.Bars[59]
	if len(last.Segs) != 4 || last.Segs[0].Y+last.Segs[0].H != c.Base || last.Segs[3].Y != c.Base-chartPlotH || last.Segs[2].Class != "held" {
		t.Fatalf("busiest bar %+v: want four segments from the base to the top, held third", last)
	}
	if h := c.Bars[30].Segs[0].H; h != chartPlotH/2 {
		t.Fatalf("half the busiest minute is %d high, want %d", h, chartPlotH/2)
	}
	if len(c.Bars[0].Segs) != 0 || !strings.Contains(last.Title, "60 processed, 20 duplicates blocked, 10 held, 5 quarantined, 5 conflicts") {
		t.Fatalf("empty minute %+v, title %q", c.Bars[0], last.Title)
	}
}

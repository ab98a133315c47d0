package consoleui

import (
	"fmt"

	"github.com/onceflow/onceflow/internal/metrics"
)

// Chart is the overview's deliveries per minute over the last hour, drawn on the server as
// SVG. It has one stacked bar per minute, each with a title giving its figures. A bar
// stacks the processed deliveries, blocked duplicates, held deliveries, quarantined ones
// and conflicts.
type Chart struct {
	Width, Height int
	Left, Base    int // the plot's left edge and baseline
	Bars          []bar
	Max           int64 // the tallest minute
	Ticks         []tick
}

type bar struct {
	X, W  int
	Title string
	Segs  []seg
}

type seg struct {
	Y, H  int
	Class string
}

type tick struct {
	X     int
	Label string
}

const (
	chartBarW   = 10
	chartLeft   = 48
	chartTop    = 8
	chartPlotH  = 110
	chartBottom = 22
)

// NewChart draws minutes, one bar each, the oldest first.
func NewChart(minutes []metrics.MinuteCount) Chart {
	c := Chart{Left: chartLeft, Base: chartTop + chartPlotH, Height: chartTop + chartPlotH + chartBottom}
	c.Width = chartLeft + len(minutes)*chartBarW + 8
	for _, m := range minutes {
		c.Max = max(c.Max, m.Total())
	}
	scale := func(n int64) int {
		if c.Max == 0 || n == 0 {
			return 0
		}
		return max(1, int(n*chartPlotH/c.Max))
	}
	for i, m := range minutes {
		b := bar{X: chartLeft + i*chartBarW + 1, W: chartBarW - 2,
			Title: fmt.Sprintf("%s UTC: %d processed, %d duplicates blocked, %d held, %d quarantined, %d conflicts",
				m.Minute.Format("15:04"), m.Processed, m.Duplicate, m.Held, m.Quarantined, m.Conflict)}
		y := c.Base
		for _, s := range []struct {
			n     int64
			class string
		}{{m.Processed, "processed"}, {m.Duplicate, "duplicate"}, {m.Held, "held"}, {m.Quarantined + m.Conflict, "failed"}} {
			if h := scale(s.n); h > 0 {
				y -= h
				b.Segs = append(b.Segs, seg{Y: y, H: h, Class: s.class})
			}
		}
		c.Bars = append(c.Bars, b)
	}
	n := len(minutes)
	for _, at := range []int{0, n / 2, n - 1} {
		if at < 0 || at >= n {
			continue
		}
		label := fmt.Sprintf("-%d min", n-1-at)
		if at == n-1 {
			label = "now"
		}
		c.Ticks = append(c.Ticks, tick{X: chartLeft + at*chartBarW + chartBarW/2, Label: label})
	}
	return c
}

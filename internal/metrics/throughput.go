package metrics

import (
	"sync/atomic"
	"time"
)

// ringOutcomes are the engine.Outcome values the console counts. Any other is left out.
var ringOutcomes = [...]string{"processed", "duplicate", "quarantined", "conflict", "held"}

// throughput totals the deliveries this process observed since it started, by outcome. The
// console shows them as "since the start". Its per-minute figures come from the history in
// HistoryTable.
type throughput struct {
	totals [len(ringOutcomes)]atomic.Int64
	since  time.Time
}

func newThroughput(now time.Time) *throughput { return &throughput{since: now} }

func outcomeIndex(outcome string) int {
	for i, o := range ringOutcomes {
		if o == outcome {
			return i
		}
	}
	return -1
}

func (t *throughput) add(outcome string) {
	if i := outcomeIndex(outcome); i >= 0 {
		t.totals[i].Add(1)
	}
}

// MinuteCount is the deliveries of one minute by outcome.
type MinuteCount struct {
	Minute      time.Time // the minute's start
	Processed   int64
	Duplicate   int64 // blocked as duplicates
	Quarantined int64
	Conflict    int64
	Held        int64 // not run: the key is quarantined until a replay releases it
}

// add counts n deliveries of outcome. Any other outcome is left out.
func (c *MinuteCount) add(outcome string, n int64) {
	switch outcome {
	case "processed":
		c.Processed += n
	case "duplicate":
		c.Duplicate += n
	case "quarantined":
		c.Quarantined += n
	case "conflict":
		c.Conflict += n
	case "held":
		c.Held += n
	}
}

// Total is the minute's deliveries of every counted outcome.
func (c MinuteCount) Total() int64 {
	return c.Processed + c.Duplicate + c.Quarantined + c.Conflict + c.Held
}

// Throughput is the deliveries this process observed since it started.
type Throughput struct {
	Totals MinuteCount // since Since (Minute is zero)
	Since  time.Time
}

// Throughput returns the deliveries this process observed since it started, by outcome.
func (m *Metrics) Throughput() Throughput {
	t := m.throughput
	return Throughput{Since: t.since, Totals: MinuteCount{Processed: t.totals[0].Load(), Duplicate: t.totals[1].Load(),
		Quarantined: t.totals[2].Load(), Conflict: t.totals[3].Load(), Held: t.totals[4].Load()}}
}

package metrics

import (
	"sync"
	"sync/atomic"
	"time"
)

// Outcomes the throughput ring counts (inbox.Outcome values); any other is left out.
var ringOutcomes = [...]string{"processed", "duplicate", "quarantined", "conflict", "held"}

// ringMinutes is how far back the ring remembers: the console's last hour.
const ringMinutes = 60

// minuteBucket counts one minute's deliveries by outcome. minute is the minute's Unix time
// divided by 60; a bucket whose minute is not the one asked for is stale (counts from an
// hour or more ago) and reads as zero.
type minuteBucket struct {
	minute atomic.Int64
	counts [len(ringOutcomes)]atomic.Int64
}

// throughput is an in-memory ring of per-minute delivery counts over the last hour, and
// totals since the process started, fed by Observe. Adding is a few atomic operations; a
// bucket is reset under the mutex once per minute.
type throughput struct {
	mu      sync.Mutex
	buckets [ringMinutes]minuteBucket
	totals  [len(ringOutcomes)]atomic.Int64
	since   time.Time
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

func (t *throughput) add(outcome string, now time.Time) {
	i := outcomeIndex(outcome)
	if i < 0 {
		return
	}
	t.totals[i].Add(1)
	m := now.Unix() / 60
	b := &t.buckets[m%ringMinutes]
	if b.minute.Load() != m {
		t.mu.Lock()
		if b.minute.Load() != m {
			for j := range b.counts {
				b.counts[j].Store(0)
			}
			b.minute.Store(m)
		}
		t.mu.Unlock()
	}
	b.counts[i].Add(1)
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

// Total is the minute's deliveries of every counted outcome.
func (c MinuteCount) Total() int64 {
	return c.Processed + c.Duplicate + c.Quarantined + c.Conflict + c.Held
}

// Throughput is the deliveries this process observed: per minute over the last hour, and
// in total since it started.
type Throughput struct {
	Minutes []MinuteCount // ringMinutes entries, oldest first, the current minute last
	Totals  MinuteCount   // since Since (Minute is zero)
	Since   time.Time
}

// Throughput returns the per-minute delivery counts of the last hour (the current minute
// last) and the totals since the process started, as Observe recorded them.
func (m *Metrics) Throughput(now time.Time) Throughput {
	t := m.throughput
	out := Throughput{Since: t.since, Minutes: make([]MinuteCount, ringMinutes)}
	cur := now.Unix() / 60
	for k := range ringMinutes {
		minute := cur - int64(ringMinutes-1-k)
		c := MinuteCount{Minute: time.Unix(minute*60, 0).UTC()}
		b := &t.buckets[minute%ringMinutes]
		if b.minute.Load() == minute {
			c.Processed, c.Duplicate = b.counts[0].Load(), b.counts[1].Load()
			c.Quarantined, c.Conflict, c.Held = b.counts[2].Load(), b.counts[3].Load(), b.counts[4].Load()
		}
		out.Minutes[k] = c
	}
	out.Totals = MinuteCount{Processed: t.totals[0].Load(), Duplicate: t.totals[1].Load(),
		Quarantined: t.totals[2].Load(), Conflict: t.totals[3].Load(), Held: t.totals[4].Load()}
	return out
}

package kafkax

import (
	"context"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// RecordOverhead is what a record handed out costs beyond its value, key and headers. It is
// charged to the Budget with each record. It stands for the record's Watermill message,
// context and handler goroutine, the watcher of its ack and its place in the window. See
// docs/BENCHMARKS.md, section "kafka.window 1024, kafka.max_in_flight_bytes 64 MiB and
// runtime.gogc 100".
const RecordOverhead = 8 << 10

// Budget bounds the bytes of the records read from Kafka and not yet acked by every
// ParallelSubscriber sharing it. A router has one budget. A record is charged when Sarama
// puts it in its channel of the partition, and it waits there until its cost fits. The
// charge stays with it while it waits in the window and once handed out, until its ack. A
// record costs its value, key and headers plus RecordOverhead. A record costing more than
// the whole budget takes all of it. Waiting is first come, first served, so small records
// do not starve a big one.
type Budget struct {
	sem   *semaphore.Weighted
	limit int64
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes, at least 1.
func NewBudget(limit int64) *Budget {
	limit = max(limit, 1)
	return &Budget{sem: semaphore.NewWeighted(limit), limit: limit}
}

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// InUse is the bytes charged now.
func (b *Budget) InUse() int64 { return b.used.Load() }

// acquire charges n bytes, capped at the limit, and waits until they fit or ctx ends. It
// returns what it charged, or 0 when ctx ended first.
func (b *Budget) acquire(ctx context.Context, n int64) int64 {
	n = min(max(n, 1), b.limit)
	if err := b.sem.Acquire(ctx, n); err != nil {
		return 0
	}
	b.used.Add(n)
	return n
}

// release gives back n bytes charged by acquire.
func (b *Budget) release(n int64) {
	if n > 0 {
		b.used.Add(-n)
		b.sem.Release(n)
	}
}

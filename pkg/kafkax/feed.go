package kafkax

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/msgsource"
)

// feed charges the records of one subscription of a ParallelSubscriber to its Budget as
// Sarama hands them to a partition's channel. It is the consumer's interceptor. Sarama
// calls OnConsume on its goroutine of the partition after the fetch response was decoded,
// just before the record goes into the channel. OnConsume waits there until the record's
// cost fits in the budget. So the records in Sarama's channels are charged like those
// waiting in the window and those handed out. While OnConsume waits, Sarama's broker
// consumer waits for it before it sends the next fetch, so no more records are read.
//
// Once charged, a record is made the message it is handed out as. The message owns copies
// of its payload, key and metadata. The record lets go of the fetch response's bytes. So
// the response is garbage once every record of it went into a channel.
type feed struct {
	s     *ParallelSubscriber
	topic string

	mu    sync.Mutex                           // held to change parts
	parts atomic.Pointer[map[int32]*readAhead] // the partitions read now, from the session's Setup to the end of the claim's reading; replaced, never changed
}

var _ sarama.ConsumerInterceptor = (*feed)(nil)

// readAhead is the records of one claimed partition charged by the feed and not yet taken
// by the claim, in the order they went into Sarama's channel.
type readAhead struct {
	budget *Budget
	ctx    context.Context // ends with the session or when the claim stops reading
	cancel context.CancelFunc

	lastKM atomic.Pointer[sarama.ConsumerMessage] // the record charged last (written by OnConsume only)

	mu     sync.Mutex
	closed bool
	recs   []charge
	bytes  int64
}

// charge is a record that prepare made a message, and what it costs the budget.
type charge struct {
	km   *sarama.ConsumerMessage
	msg  *message.Message // its payload the record's value as owned (own)
	key  string
	cut  *msgsource.Cut // the value was cut
	cost int64
}

func newFeed(s *ParallelSubscriber, topic string) *feed {
	f := &feed{s: s, topic: topic}
	f.parts.Store(&map[int32]*readAhead{})
	return f
}

// open returns the read-ahead of partition p. It makes a new one, which ends with ctx,
// unless one is open and its session still runs.
func (f *feed) open(p int32, ctx context.Context) *readAhead {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ra := (*f.parts.Load())[p]; ra != nil {
		if ra.ctx.Err() == nil {
			return ra
		}
		ra.close() // left by a session that ended without its Cleanup
	}
	ra := &readAhead{budget: f.s.budget}
	ra.ctx, ra.cancel = context.WithCancel(ctx)
	parts := maps.Clone(*f.parts.Load())
	parts[p] = ra
	f.parts.Store(&parts)
	return ra
}

// close ends the read-ahead of partition p and gives back what its records cost, because
// the claim reads no more. The records Sarama still puts in the channel are neither charged
// nor owned. Sarama drops them when the claim ends.
func (f *feed) close(p int32, ra *readAhead) {
	f.mu.Lock()
	if parts := *f.parts.Load(); parts[p] == ra {
		parts = maps.Clone(parts)
		delete(parts, p)
		f.parts.Store(&parts)
	}
	f.mu.Unlock()
	ra.close()
}

// closeAll closes every read-ahead still open. These belong to the session's partitions
// whose claim never started.
func (f *feed) closeAll() {
	f.mu.Lock()
	parts := *f.parts.Load()
	f.parts.Store(&map[int32]*readAhead{})
	f.mu.Unlock()
	for _, ra := range parts {
		ra.close()
	}
}

// OnConsume charges km to the budget, waiting until its cost fits, and makes it the message
// it is handed out as. km then holds none of the fetch response's bytes. OnConsume leaves
// some records as they are. One is a record of a partition that no claim reads. Another is
// a record met again after Sarama's MaxProcessingTime ran out while it waited for room in
// the channel.
func (f *feed) OnConsume(km *sarama.ConsumerMessage) {
	ra := (*f.parts.Load())[km.Partition]
	if ra == nil || ra.lastKM.Load() == km {
		return
	}
	cost := f.s.budget.acquire(ra.ctx, recordCost(f.s.ownedLen(len(km.Value)), km))
	if cost == 0 {
		return // the claim stopped reading while the record waited
	}
	c := f.s.prepare(km)
	c.km, c.cost = km, cost
	km.Key, km.Value, km.Headers = nil, nil, nil
	ra.lastKM.Store(km)
	if !ra.add(c) {
		f.s.budget.release(cost)
	}
}

// prepare makes km the message it is handed out as, with unmarshal. The message has km's
// value as own returns it, and km's key. The charge's cost is what km costs the budget.
func (s *ParallelSubscriber) prepare(km *sarama.ConsumerMessage) charge {
	value, cut := s.own(km.Value)
	return charge{msg: unmarshal(km, value), key: string(km.Key), cut: cut, cost: recordCost(len(value), km)}
}

// add appends c. It returns false once closed, and the caller then gives back c's cost.
func (ra *readAhead) add(c charge) bool {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if ra.closed {
		return false
	}
	ra.recs = append(ra.recs, c)
	ra.bytes += c.cost
	return true
}

// take returns km's charge, now the claim's, and whether the feed charged km. It gives back
// the records charged before km and never taken, which Sarama dropped.
func (ra *readAhead) take(km *sarama.ConsumerMessage) (charge, bool) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for i, c := range ra.recs {
		if c.km != km {
			continue
		}
		for _, skipped := range ra.recs[:i] {
			ra.budget.release(skipped.cost)
			ra.bytes -= skipped.cost
		}
		clear(ra.recs[:i+1])
		ra.recs = ra.recs[i+1:]
		ra.bytes -= c.cost
		return c, true
	}
	return charge{}, false
}

// held is how many records wait to be taken and what they cost.
func (ra *readAhead) held() (int, int64) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return len(ra.recs), ra.bytes
}

func (ra *readAhead) close() {
	ra.cancel()
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if ra.closed {
		return
	}
	ra.closed = true
	ra.budget.release(ra.bytes)
	ra.recs, ra.bytes = nil, 0
}

// stopReading ends the claim's read-ahead once read has returned, and pauses the
// partition, so that Sarama fetches nothing more for it while the claim waits for its
// messages in flight.
func (r *claimRun) stopReading() {
	r.h.feed.close(r.partition, r.ahead)
	r.idleMu.Lock()
	defer r.idleMu.Unlock()
	r.idle.stopped = true
	if p, ok := r.claim.(interface{ Pause() }); ok {
		p.Pause()
	}
}

package inbox

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Slow outside calls belong to the delivery, not to the batch. A Batcher whose handler is a
// BatchPreparer, or a plain handler that is a Preparer, prepares every delivery as soon as
// it is decoded — on its own goroutine, without any lock, at most
// BatchConfig.MaxInFlightCalls at once — and hands it to the collector only once prepared,
// so a batch's transaction never waits on a call and one slow call delays only its own
// delivery.
//
// A plain Preparer's Prepare is called for the delivery's first step (Step 0, Attempt 1),
// as Process would before the step's transaction; Handle then finds what it prepared in
// Delivery.Prepared. When Prepare fails (error, panic, inbox.handler_timeout) the delivery
// does not enter a batch: its attempt is counted on its row, and it is retried alone (or
// quarantined) as on the one-at-a-time path (grouped.go). A BatchPreparer's failure only
// leaves the delivery unprepared: HandleBatch leaves it at Continue.
//
// Per key, one delivery at a time: a delivery whose business key is already in the Batcher
// (being prepared, queued, in a batch, or on the one-at-a-time path) waits, unprepared,
// until that one has its final outcome. A key recently finished by this Batcher is not
// prepared again (its next delivery is a duplicate, found by the claim): no outside calls
// for duplicates.

// prepareGate is a Batcher's per-delivery preparation.
type prepareGate struct {
	b     *Batcher
	prep  func(ctx context.Context, d *Delivery) error // PrepareDelivery, or a plain handler's Prepare
	plain bool                                         // prep is a plain Preparer's: a failure is a failed attempt
	sem   chan struct{}                                // one slot per prepare running

	mu      sync.Mutex
	waiting map[string][]*pending // key in the Batcher → deliveries of that key waiting behind it
	recent  recentKeys            // keys this Batcher finished (done), most recent last

	running  atomic.Int64 // prepares running now
	prepared atomic.Int64 // prepares that succeeded
	failed   atomic.Int64 // prepares that failed, panicked or timed out (left to the one-at-a-time path)
	skipped  atomic.Int64 // deliveries not prepared: their key was recently finished
	observe  func(elapsed time.Duration, err error)
}

func newPrepareGate(b *Batcher, prep func(context.Context, *Delivery) error, plain bool, inFlight int) *prepareGate {
	return &prepareGate{b: b, prep: prep, plain: plain, sem: make(chan struct{}, inFlight), waiting: map[string][]*pending{},
		recent: newRecentKeys(recentKeysKept)}
}

// recentKeysKept is how many recently finished keys a Batcher remembers so that their
// redeliveries make no outside calls (a rebalance redelivers up to a window per partition).
const recentKeysKept = 1 << 16

// admit takes a decoded delivery: it is prepared now, or queued behind its key.
func (g *prepareGate) admit(p *pending) {
	p.gated.Store(true)
	g.mu.Lock()
	if q, busy := g.waiting[p.dec.Key]; busy {
		g.waiting[p.dec.Key] = append(q, p)
		g.mu.Unlock()
		return
	}
	g.waiting[p.dec.Key] = nil
	g.mu.Unlock()
	go g.run(p)
}

// release is called once per admitted delivery, when it has its final outcome: the next
// delivery of its key, if any, is prepared. done says the key's row is 'done' now.
func (g *prepareGate) release(p *pending, done bool) {
	key := p.dec.Key
	g.mu.Lock()
	if done {
		g.recent.add(key)
	}
	q := g.waiting[key]
	if len(q) == 0 {
		delete(g.waiting, key)
		g.mu.Unlock()
		return
	}
	next := q[0]
	q[0] = nil
	g.waiting[key] = q[1:]
	g.mu.Unlock()
	go g.run(next)
}

// run prepares p (unless its key was just finished) and queues it for the collector.
func (g *prepareGate) run(p *pending) {
	b := g.b
	g.mu.Lock()
	recent := g.recent.has(p.dec.Key)
	g.mu.Unlock()
	switch {
	case recent:
		g.skipped.Add(1)
	case p.ctx.Err() != nil:
		// The caller gave up (its claim ended): the batch falls it back unprepared.
	default:
		var err error
		select {
		case g.sem <- struct{}{}:
			err = g.prepare(p)
			<-g.sem
		case <-b.stop:
			p.done <- batchOutcome{fallback: true}
			return
		case <-p.ctx.Done():
		}
		if err != nil && g.plain && p.ctx.Err() == nil {
			// A plain handler's attempt failed before its transaction: not batched.
			p.done <- batchOutcome{failed: &failure{err: err}}
			return
		}
	}
	select {
	case b.queue <- p:
	case <-b.stop:
		p.done <- batchOutcome{fallback: true}
	}
}

// prepare runs PrepareDelivery (or Prepare) under inbox.handler_timeout and keeps what it
// prepared. A failure (error, panic, timeout) leaves the delivery unprepared: HandleBatch
// leaves it to the one-at-a-time path, which retries it with backoff like any failed step;
// a plain Preparer's failure is returned.
func (g *prepareGate) prepare(p *pending) error {
	g.running.Add(1)
	defer g.running.Add(-1)
	start := time.Now()
	d := &Delivery{Message: p.msg, BizType: g.b.ib.cfg.BizType, Key: p.dec.Key, Value: p.dec.Value, Source: p.src, Attempt: 1}
	ctx, cancel := context.WithTimeout(p.ctx, g.b.ib.cfg.HandlerTimeout)
	err := guard(ctx, "prepare delivery", func() error { return g.prep(ctx, d) })
	cancel()
	if g.observe != nil {
		g.observe(time.Since(start), err)
	}
	if err != nil {
		g.failed.Add(1)
		return err // d may still be written by abandoned code: nothing of it is used
	}
	g.prepared.Add(1)
	p.prepared, p.ready = d.Prepared, true
	return nil
}

// recentKeys is a bounded set of keys: the oldest is forgotten when a new one is added to
// a full set.
type recentKeys struct {
	set  map[string]struct{}
	ring []string
	next int
}

func newRecentKeys(n int) recentKeys {
	return recentKeys{set: make(map[string]struct{}, n), ring: make([]string, n)}
}

func (r *recentKeys) has(k string) bool { _, ok := r.set[k]; return ok }

func (r *recentKeys) add(k string) {
	if r.has(k) {
		return
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.set, old)
	}
	r.ring[r.next] = k
	r.set[k] = struct{}{}
	r.next = (r.next + 1) % len(r.ring)
}

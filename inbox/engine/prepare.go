package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/tracex"
)

// Slow outside calls belong to the delivery, not to the batch. A Batcher whose handler is a
// inbox.Preparer prepares every delivery as soon as it is decoded. Each delivery is prepared on
// its own goroutine, without any lock. At most Config.MaxInFlightCalls prepare at once,
// in the inbox's call slots, which Process shares. The Batcher hands a delivery to the
// collector only once it is prepared. So a batch's transaction never waits on a call, and
// one slow call delays only its own delivery.
//
// Prepare is called for the delivery's first step, Step 0 of Attempt 1, as Process would
// call it before the step's transaction. Handle or HandleBatch then finds what it prepared
// in Delivery.Prepared. A Prepare may fail with an error, a panic or at
// inbox.handler_timeout. The delivery then does not enter a batch. Its attempt is counted
// on its row, and it is retried alone or quarantined, as on the one-at-a-time path.
//
// Per key, only one delivery makes calls. A delivery's business key may already be in the
// Batcher, being prepared, queued, in a batch or on the one-at-a-time path. The delivery
// is then not prepared, and follows the earlier one unprepared. It is held until the
// earlier one is queued, and then queued right behind it. So copies arriving together end
// in one batch, and are counted as duplicates in the same transaction. When the first
// copy's batch already runs, they end in the next batch, which finds the row done. A key
// this Batcher finished recently is not prepared again either. So duplicates make no
// outside calls. An unprepared delivery that turns out not to be a duplicate takes the
// one-at-a-time path, which prepares each step itself.

// prepareGate is a Batcher's per-delivery preparation.
type prepareGate struct {
	b    *Batcher
	prep func(ctx context.Context, d *inbox.Delivery) error // the handler's Prepare
	sem  chan struct{}                                      // the inbox's call slots, Config.MaxInFlightCalls of them

	mu     sync.Mutex
	keys   map[string]*gateKey // business keys with a delivery in the Batcher
	recent recentKeys          // keys this Batcher finished (done), most recent last

	running  atomic.Int64 // prepares running now
	prepared atomic.Int64 // prepares that succeeded
	failed   atomic.Int64 // prepares that failed, panicked or timed out, left to the one-at-a-time path
	skipped  atomic.Int64 // deliveries not prepared, such as those whose key was finished recently
	observe  func(elapsed time.Duration, err error)
}

func newPrepareGate(b *Batcher, prep func(context.Context, *inbox.Delivery) error, slots chan struct{}) *prepareGate {
	return &prepareGate{b: b, prep: prep, sem: slots, keys: map[string]*gateKey{},
		recent: newRecentKeys(recentKeysKept)}
}

// recentKeysKept is how many recently finished keys a Batcher remembers, so that their
// redeliveries make no outside calls. A rebalance redelivers up to a window per partition.
const recentKeysKept = 1 << 16

// gateKey is a business key with a delivery in the Batcher, the one admitted first.
type gateKey struct {
	queued    bool       // the first delivery went to the collector
	followers []*pending // later deliveries of the key, held until it does
}

// admit takes a decoded delivery. The first delivery of its key in the Batcher is
// prepared. A later one follows it unprepared.
func (g *prepareGate) admit(p *pending) {
	g.mu.Lock()
	k := g.keys[p.dec.Key]
	switch {
	case k == nil:
		g.keys[p.dec.Key] = &gateKey{}
		p.gated.Store(true)
		g.mu.Unlock()
		go g.run(p)
	case k.queued:
		g.mu.Unlock()
		g.skipped.Add(1)
		go g.queue(p)
	default:
		k.followers = append(k.followers, p)
		g.mu.Unlock()
		g.skipped.Add(1)
	}
}

// queued records that the key's first delivery went to the collector and queues the
// deliveries that followed it.
func (g *prepareGate) queued(p *pending) {
	g.mu.Lock()
	var fs []*pending
	if k := g.keys[p.dec.Key]; k != nil {
		k.queued, fs, k.followers = true, k.followers, nil
	}
	g.mu.Unlock()
	for _, f := range fs {
		g.queue(f)
	}
}

// release is called once per key's first delivery, when it has its final outcome. The key
// then leaves the Batcher. done says the key's row is 'done' now.
func (g *prepareGate) release(p *pending, done bool) {
	key := p.dec.Key
	g.mu.Lock()
	if done {
		g.recent.add(key)
	}
	var fs []*pending
	if k := g.keys[key]; k != nil {
		fs = k.followers // only when the first was answered without being queued
		delete(g.keys, key)
	}
	g.mu.Unlock()
	for _, f := range fs {
		go g.queue(f)
	}
}

// run prepares a key's first delivery, unless the key was just finished, and queues it for
// the collector. It first takes the key's call lease, described in calls.go. A row that is
// done, quarantined or another message's is not prepared, and the batch decides what it
// is. The lease may not be taken, when the caller gave up or the database is unreachable.
// The delivery is then left unprepared, and the one-at-a-time path takes it.
func (g *prepareGate) run(p *pending) {
	g.mu.Lock()
	recent := g.recent.has(p.dec.Key)
	g.mu.Unlock()
	if recent || p.ctx.Err() != nil {
		if recent {
			g.skipped.Add(1)
		}
		g.queueFirst(p)
		return
	}
	hold, row, found, err := g.b.ib.leases.Take(p.ctx, p.dec.Key)
	if err != nil {
		g.queueFirst(p)
		return
	}
	p.hold = hold
	if !mayCall(found, row, p.dec, g.b.ib.liveOptions()) {
		g.skipped.Add(1)
		g.queueFirst(p)
		return
	}
	select {
	case g.sem <- struct{}{}:
		g.prepare(p) // queues p or answers it
		return
	case <-g.b.stop:
		p.answer(batchOutcome{fallback: true})
		return
	case <-p.ctx.Done():
	}
	g.queueFirst(p)
}

// queue hands p to the collector.
func (g *prepareGate) queue(p *pending) {
	select {
	case g.b.queue <- p:
	case <-g.b.stop:
		p.answer(batchOutcome{fallback: true})
	}
}

// queueFirst hands a key's first delivery to the collector, then the deliveries that
// followed it.
func (g *prepareGate) queueFirst(p *pending) {
	g.queue(p)
	g.queued(p)
}

// prepare runs Prepare under inbox.handler_timeout, on this goroutine. It then frees its
// call slot and queues p with what it prepared. An error, a panic or the timeout is the
// delivery's failed attempt. A call still running at the timeout is abandoned. A timer
// cancels its context and moves p on without it, and the call keeps its slot until it
// returns. prepare runs for every delivery, and most prepare in microseconds. So a timer
// watches the timeout, not a second goroutine per delivery.
func (g *prepareGate) prepare(p *pending) {
	g.running.Add(1)
	start := time.Now()
	ctx, cancel := context.WithCancel(p.ctx)
	var state atomic.Int32 // 0 while running, 1 once returned, 2 once timed out
	timer := time.AfterFunc(g.b.ib.cfg.HandlerTimeout, func() {
		if state.CompareAndSwap(0, 2) {
			cancel()
			g.finish(p, start, fmt.Errorf("prepare: %w", ErrHandlerTimeout), nil)
		}
	})
	d := &inbox.Delivery{Message: p.msg, BizType: g.b.ib.cfg.BizType, Key: p.dec.Key, Value: p.dec.Value, Source: p.src, Attempt: 1}
	ctx, span := g.b.ib.startSpan(ctx, "inbox prepare") // in the delivery's trace, if the inbox traces
	hold := p.hold
	hold.Begin() // the key stays held until this call returns, even if it is abandoned
	err := func() (err error) {
		defer func() {
			if perr := recovered(recover()); perr != nil {
				err = perr
			}
		}()
		defer hold.CallEnded()
		return g.prep(ctx, d)
	}()
	tracex.End(span, err)
	timer.Stop()
	cancel()
	<-g.sem
	if state.CompareAndSwap(0, 1) {
		g.finish(p, start, err, d)
	}
}

// finish records a prepare's outcome and moves p on. d is nil for a prepare abandoned at
// its timeout. The abandoned code may still write its Delivery, so nothing of it is used.
func (g *prepareGate) finish(p *pending, start time.Time, err error, d *inbox.Delivery) {
	g.running.Add(-1)
	if g.observe != nil {
		g.observe(time.Since(start), err)
	}
	if err != nil {
		g.failed.Add(1)
		if p.ctx.Err() == nil {
			// The attempt failed before its transaction, so it is not batched.
			p.answer(batchOutcome{failed: &failure{err: err}})
			return
		}
	} else {
		g.prepared.Add(1)
		p.prepared, p.ready = d.Prepared, true
	}
	g.queueFirst(p)
}

// recentKeys is a bounded set of keys. The oldest key is forgotten when a new one is added
// to a full set.
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

package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// BreakerState is the state of an inbox's circuit breaker.
type BreakerState int

// The breaker's states have the values of the onceflow_inbox_breaker_state metric.
const (
	BreakerClosed   BreakerState = 0 // deliveries run
	BreakerOpen     BreakerState = 1 // deliveries wait before their next attempt
	BreakerHalfOpen BreakerState = 2 // one probe delivery runs, the others wait
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	default:
		return "closed"
	}
}

// BreakerStatus is what an inbox's breaker shows.
type BreakerStatus struct {
	State BreakerState
	Since time.Time // when it entered State (zero: closed since the start)
	Opens int64     // times it opened (a failed probe opens it again)
	// ProbeAt is when an open breaker lets a probe run.
	ProbeAt time.Time
	// LastError is the error of the last failed attempt the breaker counted. That is the
	// attempt that opened it, or the probe that failed. It is empty while the breaker has
	// counted none.
	LastError string
}

// BreakerObserver, when the inbox's Observer implements it, is told of every change of the
// breaker's state, such as for metrics.
type BreakerObserver interface {
	BreakerChanged(bizType string, s BreakerStatus)
}

const (
	breakerWindow   = 10 * time.Second // attempts counted for the failure ratio
	breakerMaxProbe = time.Minute      // longest wait between probes
)

// verdict is what one attempt says about the plugin's dependencies.
type verdict int

const (
	verdictNone    verdict = iota // says nothing (a duplicate, a lock conflict, shutdown)
	verdictSuccess                // the handler ran and finished
	verdictFailure                // the handler's attempt failed (counts as an attempt)
	// verdictRetryFailure means a retry of a delivery failed again. Only a probe's counts.
	verdictRetryFailure
)

// breaker is an inbox's circuit breaker. A closed breaker opens when the failures of the
// window reach the ratio. An open breaker turns half-open after the open interval. A
// half-open breaker closes on a probe's success. On the probe's failure it opens again,
// with the interval doubled.
type breaker struct {
	ratio    float64
	minCalls int
	openFor  time.Duration
	notify   func(BreakerStatus, BreakerState) // the new status and the state before

	mu      sync.Mutex
	state   BreakerState
	since   time.Time
	opens   int64
	wait    time.Duration // the current open interval
	probing bool
	fresh   int           // first attempts waiting in admitTo: they probe before retries
	lastErr string        // the last counted failure's error (BreakerStatus.LastError)
	changed chan struct{} // closed at each change of state or probe
	buckets [10]bucket    // failures per second of the window

	// oks are the successes per second of the window. Each slot holds second<<okBits |
	// count, added without the lock. A success is the common verdict, recorded by every
	// delivery of a batch at once, so a mutex there would cost the router CPU. See
	// docs/BENCHMARKS.md, section "End to end against the inbox's ceiling, and the router's
	// CPU per order".
	oks [10]atomic.Int64
}

type bucket struct {
	sec    int64
	failed int
}

// okBits is the width of the count in a slot of oks.
const okBits = 28

// addOK counts a success in second sec.
func (b *breaker) addOK(sec int64) {
	slot := &b.oks[sec%int64(len(b.oks))]
	for {
		v := slot.Load()
		next := sec<<okBits | 1
		if v>>okBits == sec {
			next = v + 1
		}
		if slot.CompareAndSwap(v, next) {
			return
		}
	}
}

// oksSince sums the successes of the seconds after first.
func (b *breaker) oksSince(first int64) int {
	n := 0
	for i := range b.oks {
		if v := b.oks[i].Load(); v>>okBits > first {
			n += int(v & (1<<okBits - 1))
		}
	}
	return n
}

func newBreaker(cfg Config, notify func(BreakerStatus, BreakerState)) *breaker {
	if cfg.BreakerOff {
		return nil
	}
	return &breaker{ratio: cfg.BreakerFailureRatio, minCalls: cfg.BreakerMinCalls, openFor: cfg.BreakerOpenFor, notify: notify, changed: make(chan struct{})}
}

// ticket is one admitted attempt. Its done method records its verdict, once.
type ticket struct {
	br    *breaker
	probe bool
	// retry reports that the delivery failed an attempt before, as a retry or a delayed
	// redelivery. So it may fail again for its own sake. A half-open breaker probes with a
	// first attempt when one waits.
	retry bool
	once  sync.Once
}

// deliveryVerdict counts a delivery's failure once, at its first attempt, in a delayed
// round too. The breaker measures how many deliveries fail, not how often a few bad ones
// are retried. Those alone, with nothing else arriving, would open it. They would then
// hold every delivery back behind probes that keep failing. A probe's failure always
// counts, in done.
func deliveryVerdict(v verdict, attempt int) verdict {
	if v == verdictFailure && attempt > 1 {
		return verdictRetryFailure
	}
	return v
}

func (t *ticket) done(v verdict) { t.failed(v, nil) }

// failed records the verdict of an attempt that failed with err. The breaker keeps the
// error of a failure it counts.
func (t *ticket) failed(v verdict, err error) {
	if t == nil {
		return
	}
	t.once.Do(func() { t.br.record(t.probe, v, err) })
}

// admit waits until an attempt may run. A closed breaker admits it at once. An open one
// waits until a probe may run and this attempt is it. retry says the delivery failed an
// attempt before. admit spends nothing while it waits, and returns ctx's error when ctx
// ends first. A nil breaker, turned off, admits everything.
func (b *breaker) admit(ctx context.Context, retry bool) (*ticket, error) {
	if b == nil {
		return nil, nil
	}
	t := &ticket{br: b, retry: retry}
	if err := b.admitTo(ctx, t); err != nil {
		return nil, err
	}
	return t, nil
}

// tryAdmit admits t, as admitTo, only when the breaker is closed (or nil), without
// waiting. It reports whether it did; t is then admitted as admitTo admits it.
func (b *breaker) tryAdmit(t *ticket) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	closed := b.state == BreakerClosed
	b.mu.Unlock()
	if closed {
		t.br = b
	}
	return closed
}

// admitTo is admit filling t, a ticket that is zero but for retry. A pending delivery owns
// t, so admitTo allocates nothing.
//
// A half-open breaker's probe is a first attempt whenever one waits. A retry may be a key
// that fails for its own sake. Were it the probe, its failure would open the breaker again
// while the dependency is back, and hold every good delivery behind it. A probe may fail
// for its own sake, through its data or inbox.ErrPermanent. attemptVerdict then says nothing,
// and the next waiting delivery probes.
func (b *breaker) admitTo(ctx context.Context, t *ticket) error {
	waiting := false // t is a first attempt counted in b.fresh
	for {
		b.mu.Lock()
		now := time.Now()
		if b.state == BreakerOpen && !now.Before(b.since.Add(b.wait)) {
			b.setLocked(BreakerHalfOpen, now)
		}
		switch {
		case b.state == BreakerClosed:
			if waiting {
				b.fresh--
			}
			b.mu.Unlock()
			t.br = b
			return nil
		case b.state == BreakerHalfOpen && !b.probing && (!t.retry || b.fresh == 0):
			if waiting {
				b.fresh--
			}
			b.probing = true
			b.mu.Unlock()
			t.br, t.probe = b, true
			return nil
		}
		if !t.retry && !waiting {
			b.fresh++
			waiting = true
		}
		ch := b.changed
		d := breakerMaxProbe
		if b.state == BreakerOpen {
			d = b.since.Add(b.wait).Sub(now)
		}
		b.mu.Unlock()
		tm := time.NewTimer(d)
		select {
		case <-ctx.Done():
			tm.Stop()
			if waiting {
				b.mu.Lock()
				b.fresh--
				if b.fresh == 0 && b.state == BreakerHalfOpen && !b.probing {
					b.broadcastLocked() // a retry may probe now
				}
				b.mu.Unlock()
			}
			return ctx.Err()
		case <-ch:
		case <-tm.C:
		}
		tm.Stop()
	}
}

// record takes an attempt's verdict. err is the failed attempt's error, or nil when it is
// not known.
func (b *breaker) record(probe bool, v verdict, err error) {
	if !probe {
		switch v {
		case verdictNone, verdictRetryFailure:
			return
		case verdictSuccess:
			b.addOK(time.Now().Unix())
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if v == verdictRetryFailure {
		v = verdictFailure // a probe's
	}
	if v == verdictFailure && err != nil {
		b.lastErr = breakerErrorText(err)
	}
	if probe {
		b.probing = false
		switch v {
		case verdictSuccess:
			b.buckets = [10]bucket{}
			for i := range b.oks {
				b.oks[i].Store(0)
			}
			b.setLocked(BreakerClosed, now)
		case verdictFailure:
			b.wait = min(2*b.wait, max(breakerMaxProbe, b.openFor))
			b.opens++
			b.setLocked(BreakerOpen, now)
		default:
			b.broadcastLocked() // another waiting delivery probes
		}
		return
	}
	// A failure.
	sec := now.Unix()
	bk := &b.buckets[sec%int64(len(b.buckets))]
	if bk.sec != sec {
		*bk = bucket{sec: sec}
	}
	bk.failed++
	if b.state != BreakerClosed {
		return
	}
	first := sec - int64(len(b.buckets))
	failed := 0
	for _, x := range b.buckets {
		if x.sec > first {
			failed += x.failed
		}
	}
	if total := b.oksSince(first) + failed; total >= b.minCalls && float64(failed) >= b.ratio*float64(total) {
		b.wait = b.openFor
		b.opens++
		b.setLocked(BreakerOpen, now)
	}
}

func (b *breaker) setLocked(s BreakerState, now time.Time) {
	prev := b.state
	b.state, b.since = s, now
	b.broadcastLocked()
	if b.notify != nil {
		b.notify(b.statusLocked(), prev)
	}
}

func (b *breaker) broadcastLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *breaker) statusLocked() BreakerStatus {
	s := BreakerStatus{State: b.state, Since: b.since, Opens: b.opens, LastError: b.lastErr}
	if b.state == BreakerOpen {
		s.ProbeAt = b.since.Add(b.wait)
	}
	return s
}

func (b *breaker) status() BreakerStatus {
	if b == nil {
		return BreakerStatus{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statusLocked()
}

// Breaker returns the state of the inbox's circuit breaker. A breaker turned off shows as
// closed.
func (ib *Inbox) Breaker() BreakerStatus { return ib.br.status() }

// BreakerEnabled reports whether the inbox has a circuit breaker.
func (ib *Inbox) BreakerEnabled() bool { return ib.br != nil }

// breakerErrorText is the first line of a failure's error, as the breaker keeps it. A
// panic's error goes on with its stack.
func breakerErrorText(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return validText(s, 1000)
}

// breakerChanged logs and reports a change of the breaker's state. The lines of an open
// breaker carry the error of the failure that opened it.
func (ib *Inbox) breakerChanged(s BreakerStatus, prev BreakerState) {
	last := s.LastError
	if last == "" {
		last = "no failed attempt's error was recorded"
	}
	switch {
	case s.State == BreakerOpen && prev == BreakerClosed:
		ib.logger.Error("circuit breaker open: nearly every attempt failed, deliveries wait", errors.New(last), watermill.LogFields{"probe_at": s.ProbeAt, "opens": s.Opens})
	case s.State == BreakerOpen:
		ib.logger.Info("circuit breaker probe failed, open again", watermill.LogFields{"probe_at": s.ProbeAt, "opens": s.Opens, "err": last})
	case s.State == BreakerClosed:
		ib.logger.Info("circuit breaker closed: a probe succeeded, deliveries resume", nil)
	}
	if o, ok := ib.obs.(BreakerObserver); ok {
		o.BreakerChanged(ib.cfg.BizType, s)
	}
}

// attemptVerdict is what a failed attempt's error says of the dependencies. It follows the
// switch in process, in its order. Values the database refuses with ReasonData, a
// permanent error, a lock conflict and an unreachable database say nothing. They are the
// delivery's own failures or the database's. A handler error, a panic or a timeout is a
// failure.
func attemptVerdict(ctx context.Context, err error) verdict {
	switch {
	case err == nil:
		return verdictSuccess
	case ctx.Err() != nil:
		return verdictNone
	case failureReason(err) == ReasonData, isPermanent(err):
		return verdictNone
	case failureReason(err) != ReasonRetriesExhausted:
		return verdictFailure
	case dbx.IsLockConflict(err), dbx.IsConnError(err), errors.Is(err, inbox.ErrPermanent),
		errors.Is(err, errLeaseLost), errors.Is(err, errRowMoved):
		return verdictNone
	default:
		return verdictFailure
	}
}

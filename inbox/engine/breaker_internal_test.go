package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestBreakerCountsSuccessesWithoutTheLock checks that successes recorded from many
// goroutines at once are all counted in the lock-free slots. They keep the breaker closed
// against failures under the ratio. Without them the same failures open it.
func TestBreakerCountsSuccessesWithoutTheLock(t *testing.T) {
	for _, tc := range []struct {
		name      string
		successes int
		wantOpen  bool
	}{{"successes", 1000, false}, {"no successes", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBreaker(Config{BreakerFailureRatio: 0.5, BreakerMinCalls: 20, BreakerOpenFor: time.Minute}, nil)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range tc.successes / 8 {
						b.record(false, verdictSuccess, nil)
					}
				})
			}
			wg.Wait()
			if got := b.oksSince(time.Now().Unix() - int64(len(b.oks))); got != tc.successes {
				t.Fatalf("%d successes counted, want %d", got, tc.successes)
			}
			for range 100 {
				b.record(false, verdictFailure, nil)
			}
			b.mu.Lock()
			open := b.state == BreakerOpen
			b.mu.Unlock()
			if open != tc.wantOpen {
				t.Fatalf("breaker open %v after %d successes and 100 failures, want %v", open, tc.successes, tc.wantOpen)
			}
		})
	}
}

// TestBreakerProbesWithAFirstAttempt checks that a half-open breaker's probe is a first
// attempt when one waits, never one of the retries waiting beside it. Once no first
// attempt waits, because the probe said nothing and its delivery left, a retry probes.
// Without the preference, the first waiter to wake would take the probe. Among 20 retries
// and one first attempt, that is almost always a retry.
func TestBreakerProbesWithAFirstAttempt(t *testing.T) {
	b := newBreaker(Config{BreakerFailureRatio: 0.5, BreakerMinCalls: 1, BreakerOpenFor: time.Hour}, nil)
	b.record(false, verdictFailure, errors.New("provider down"))
	if s := b.status(); s.State != BreakerOpen {
		t.Fatalf("breaker %v after a failure, want open", s.State)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type admitted struct {
		t   *ticket
		err error
	}
	probes := make(chan admitted, 32)
	admit := func(retry bool) {
		tk, err := b.admit(ctx, retry)
		probes <- admitted{tk, err}
	}
	for range 20 {
		go admit(true)
	}
	go admit(false)
	waitUntil(t, "the first attempt waiting", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.fresh == 1
	})
	// The open interval passes, so the breaker turns half-open at the next admission.
	b.mu.Lock()
	b.since = time.Now().Add(-2 * time.Hour)
	b.broadcastLocked()
	b.mu.Unlock()
	first := <-probes
	if first.err != nil || !first.t.probe || first.t.retry {
		t.Fatalf("the probe is %+v (%v), want the first attempt", first.t, first.err)
	}
	// Its delivery failed for its own sake. The probe says nothing, and a retry probes.
	first.t.done(verdictNone)
	next := <-probes
	if next.err != nil || !next.t.probe || !next.t.retry {
		t.Fatalf("the next probe is %+v (%v), want a retry", next.t, next.err)
	}
	next.t.failed(verdictFailure, errors.New("provider still down\nwith a second line"))
	s := b.status()
	if s.State != BreakerOpen || s.LastError != "provider still down" {
		t.Fatalf("after the retry's failed probe: %v, last error %q; want open, on its error's first line", s.State, s.LastError)
	}
}

// TestBreakerFirstAttemptLeavingLetsARetryProbe checks that a first attempt that stops
// waiting, because its context ends, is no longer counted as waiting. So it leaves the
// next probe to the retries.
func TestBreakerFirstAttemptLeavingLetsARetryProbe(t *testing.T) {
	b := newBreaker(Config{BreakerFailureRatio: 0.5, BreakerMinCalls: 1, BreakerOpenFor: time.Hour}, nil)
	b.record(false, verdictFailure, errors.New("provider down"))
	fctx, leave := context.WithCancel(context.Background())
	fresh := make(chan error, 1)
	go func() {
		_, err := b.admit(fctx, false)
		fresh <- err
	}()
	waitUntil(t, "the first attempt waiting", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.fresh == 1
	})
	// The breaker is half-open with a probe running elsewhere. The first attempt stops
	// waiting meanwhile.
	b.mu.Lock()
	b.setLocked(BreakerHalfOpen, time.Now())
	b.probing = true
	b.mu.Unlock()
	leave()
	if err := <-fresh; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first attempt's wait ended with %v, want its context's error", err)
	}
	// The probe running says nothing, so a retry takes the next one at once.
	b.record(true, verdictNone, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tk, err := b.admit(ctx, true)
	if err != nil || !tk.probe {
		t.Fatalf("the retry got %+v (%v), want the probe", tk, err)
	}
}

// waitUntil polls cond until it holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

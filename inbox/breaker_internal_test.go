package inbox

import (
	"sync"
	"testing"
	"time"
)

// TestBreakerCountsSuccessesWithoutTheLock: successes recorded from many goroutines at once
// are all counted (the lock-free slots), and they keep the breaker closed against failures
// under the ratio; without them the same failures open it.
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
						b.record(false, verdictSuccess)
					}
				})
			}
			wg.Wait()
			if got := b.oksSince(time.Now().Unix() - int64(len(b.oks))); got != tc.successes {
				t.Fatalf("%d successes counted, want %d", got, tc.successes)
			}
			for range 100 {
				b.record(false, verdictFailure)
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

package outbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// countingBatches finds nothing to publish, except when rows says it does, and records
// when each read ran.
type countingBatches struct {
	mu    sync.Mutex
	at    []time.Time
	rows  int
	wakes bool
	base  time.Duration
	max   time.Duration
}

func (b *countingBatches) batch(context.Context) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.at = append(b.at, time.Now())
	n := b.rows
	b.rows = 0
	return n, nil
}
func (b *countingBatches) idleWait() time.Duration { return b.base }
func (b *countingBatches) cleans() bool            { return false }
func (b *countingBatches) wakeable() bool          { return b.wakes }
func (b *countingBatches) idleMax() time.Duration  { return b.max }

func (b *countingBatches) reads() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.at...)
}

func runLoop(t *testing.T, b batches) (r *relayBase, stop func()) {
	t.Helper()
	r = &relayBase{cfg: RelayConfig{RetryBackoff: time.Second}, logger: watermill.NopLogger{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.loop(ctx, "", b) }()
	return r, func() { cancel(); <-done }
}

func TestIdleWaitAfter(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		base, limit time.Duration
		idle        int
		want        time.Duration
	}{
		{50 * ms, 0, 9, 50 * ms},           // no IdlePollMax: every PollInterval
		{50 * ms, 20 * ms, 9, 50 * ms},     // a limit below the poll interval changes nothing
		{50 * ms, time.Second, 0, 50 * ms}, // the first idle wait is the poll interval
		{50 * ms, time.Second, 1, 100 * ms},
		{50 * ms, time.Second, 4, 800 * ms},
		{50 * ms, time.Second, 5, time.Second},
		{50 * ms, time.Second, 1000, time.Second}, // no overflow however long it idles
	} {
		if got := idleWaitAfter(c.base, c.idle, c.limit); got != c.want {
			t.Errorf("idleWaitAfter(%s, %d, %s) = %s, want %s", c.base, c.idle, c.limit, got, c.want)
		}
	}
}

// TestIdleRelayBacksOff: a wakeable loop that finds nothing reads less and less often, up to
// its idleMax; a Wake makes it read at once and starts the backoff over; a read that finds
// rows does too. A loop that Wake does not reach (a standby) keeps its poll.
func TestIdleRelayBacksOff(t *testing.T) {
	const base, limit = 10 * time.Millisecond, 400 * time.Millisecond
	b := &countingBatches{wakes: true, base: base, max: limit}
	r, stop := runLoop(t, b)
	defer stop()
	time.Sleep(1200 * time.Millisecond)
	at := b.reads()
	// 10+20+40+80+160 ms, then every 400 ms: about 8 reads; every 10 ms it would be 120.
	if len(at) < 4 || len(at) > 16 {
		t.Fatalf("%d reads in 1.2 s idle, want 4..16 (backing off from %s to %s)", len(at), base, limit)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap > limit+200*time.Millisecond {
			t.Errorf("read %d came %s after the one before, want at most %s (+ scheduling)", i, gap, limit)
		}
	}

	woken := time.Now()
	r.Wake()
	time.Sleep(300 * time.Millisecond)
	var after []time.Time
	for _, a := range b.reads() {
		if a.After(woken) {
			after = append(after, a)
		}
	}
	if len(after) < 2 {
		t.Fatalf("%d reads in the 300 ms after Wake, want the woken read and the next ones at the poll interval", len(after))
	}
	if d := after[0].Sub(woken); d > 200*time.Millisecond {
		t.Errorf("the woken read came %s after Wake, want at once", d)
	}
	if d := after[1].Sub(after[0]); d > 200*time.Millisecond {
		t.Errorf("the read after the woken one came %s later, want the poll interval (%s): a Wake starts the backoff over", d, base)
	}

	// Rows found start the backoff over too.
	time.Sleep(time.Second) // idle again, at the limit
	b.mu.Lock()
	b.rows = 3
	found := time.Now()
	b.mu.Unlock()
	time.Sleep(limit + 200*time.Millisecond)
	var since []time.Time
	for _, a := range b.reads() {
		if a.After(found) {
			since = append(since, a)
		}
	}
	if len(since) < 3 {
		t.Errorf("%d reads within %s of a read that found rows, want the backoff started over (reads at 0, 10, 30 ms …)", len(since), limit+200*time.Millisecond)
	}
}

func TestStandbyLoopKeepsItsPoll(t *testing.T) {
	b := &countingBatches{wakes: false, base: 20 * time.Millisecond, max: time.Second}
	_, stop := runLoop(t, b)
	time.Sleep(500 * time.Millisecond)
	stop()
	if n := len(b.reads()); n < 15 {
		t.Errorf("%d reads in 500 ms of a loop Wake does not reach, want one every 20 ms (about 25)", n)
	}
}

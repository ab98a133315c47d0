package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

// TestRelayWakeEndsIdleWait: an idle relay polling once a minute does not see a new row by
// itself for seconds (the check that can fail), and publishes it at once when woken.
func TestRelayWakeEndsIdleWait(t *testing.T) {
	d := testenv.DB(t, 4)
	p := &fakeProducer{}
	r := newRelay(t, d.DB, p, outbox.RelayConfig{PollInterval: time.Minute, Linger: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(300 * time.Millisecond) // the relay has read an empty outbox and sleeps
	addN(t, d.DB, "t", "wake", 1)
	time.Sleep(2 * time.Second)
	if n := pendingRows(t, d.DB); n != 1 {
		t.Fatalf("%d rows pending before Wake, want 1 (the relay should still be asleep)", n)
	}
	r.Wake()
	r.Wake() // a burst of wakes costs one read
	waitAllPublished(t, d.DB, 1, 20*time.Second)
	if r.Wakes() < 1 {
		t.Errorf("Wakes = %d, want at least 1", r.Wakes())
	}
}

// TestRelayWakeLingersOnce: a woken relay reads at once and lingers in the batch only, so
// a woken row waits one Linger, not two. With a 3 s linger the batch's linger starts well
// within 3 s of the Wake; the relay that also lingered after the wake started it after ≥ 3 s.
func TestRelayWakeLingersOnce(t *testing.T) {
	d := testenv.DB(t, 4)
	p := &fakeProducer{}
	const linger = 3 * time.Second
	lingered := make(chan time.Time, 8)
	r := newRelay(t, d.DB, p, outbox.RelayConfig{PollInterval: time.Minute, Linger: linger, LeaseTTL: time.Minute,
		Hook: func(point string) {
			if point == "linger" {
				lingered <- time.Now()
			}
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(300 * time.Millisecond) // the relay has read an empty outbox and sleeps
	addN(t, d.DB, "t", "wake-once", 1)
	woken := time.Now()
	r.Wake()
	select {
	case at := <-lingered:
		if d := at.Sub(woken); d >= linger {
			t.Fatalf("the batch's linger started %s after the Wake: the relay lingered before reading too (a woken row waits two lingers)", d)
		}
	case <-time.After(3 * linger):
		t.Fatal("the woken relay never lingered on its partial batch")
	}
	waitAllPublished(t, d.DB, 1, 20*time.Second)
}

package outbox_test

import (
	"context"
	"sync/atomic"
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

// TestEOSRelayIdleReadsOnce: an idle exactly-once relay, polling every 20 ms with no
// backoff, reads the outbox with one query per poll. The parked keys are read once a
// pending row is there, before and after its read, so a row added later is published as
// before. Read at every poll, they would have been read about 50 times within the second.
func TestEOSRelayIdleReadsOnce(t *testing.T) {
	t.Parallel()
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-eos-idle", 1)
	var parkedReads atomic.Int64
	cfg := eosConfig(t, k, outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Linger: -1,
		Hook: func(point string) {
			if point == "parked-keys" {
				parkedReads.Add(1)
			}
		}})
	relay := newEOSRelay(t, d.DB, k, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(30 * time.Second)
	for parkedReads.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // until the session's first batch
	}
	time.Sleep(100 * time.Millisecond) // its first polls, which find the outbox empty
	idleFrom := parkedReads.Load()
	time.Sleep(time.Second)
	if n := parkedReads.Load() - idleFrom; n > 0 {
		t.Errorf("an idle relay read the parked keys %d times in 1 s of 20 ms polls, want 0", n)
	}
	ids := addN(t, d.DB, topic, "idle", 3)
	waitAllPublished(t, d.DB, 3, 30*time.Second)
	if n := parkedReads.Load() - idleFrom; n < 2 {
		t.Errorf("the parked keys were read %d times for the batch after the idle polls, want 2 (before and after its read)", n)
	}
	assertExactlyOnce(t, readAll(t, k, topic), ids)
}

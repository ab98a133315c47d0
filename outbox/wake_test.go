package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/testenv"
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

package engine_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
)

// slowPrepared is effects with a Prepare that takes a while and counts the calls running
// at once.
type slowPrepared struct {
	*effects
	running, peak atomic.Int64
}

func (p *slowPrepared) Prepare(ctx context.Context, _ *inbox.Delivery) error {
	n := p.running.Add(1)
	defer p.running.Add(-1)
	for {
		pk := p.peak.Load()
		if n <= pk || p.peak.CompareAndSwap(pk, n) {
			break
		}
	}
	select {
	case <-time.After(20 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestCallSlotsAreTheInboxs checks that inbox.max_in_flight_calls is one bound per inbox.
// The Batcher's prepares and those of the one-at-a-time path take their slots from
// Config.MaxInFlightCalls. So the calls running at once never pass it, whichever path runs
// them.
func TestCallSlotsAreTheInboxs(t *testing.T) {
	const limit = 4
	h := &slowPrepared{effects: newEffects()}
	g := newGrouped(t, h, engine.Config{MaxInFlightCalls: limit}, engine.BatchConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if o := outcomes(g.send(t, keys("batched", 40))); o["processed"] != 40 {
			t.Errorf("through the Batcher: outcomes %v", o)
		}
	})
	for i, k := range keys("single", 20) {
		wg.Go(func() {
			r, err := g.inbox.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte(k)), inbox.Source{Topic: "single", Offset: int64(i)}, engine.ProcessOptions{})
			if err != nil || r.Outcome != engine.OutcomeProcessed {
				t.Errorf("%s one at a time: %s %v", k, r.Outcome, err)
			}
		})
	}
	wg.Wait()
	peak := h.peak.Load()
	t.Logf("peak %d calls at once (max_in_flight_calls %d)", peak, limit)
	if peak > limit {
		t.Fatalf("peak %d calls at once, above inbox.max_in_flight_calls %d: the Batcher and the one-at-a-time path do not share the bound", peak, limit)
	}
}

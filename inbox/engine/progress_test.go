package engine_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
)

// TestZeroProgressIsNotDone checks that the zero Progress is invalid. A Handle that
// returns it without an error has not said what it did. The one-at-a-time path never
// takes it for Done. The attempt fails and its writes are rolled back. After
// inbox.max_attempts the message is quarantined.
func TestZeroProgressIsNotDone(t *testing.T) {
	h := newEffects()
	h.progress = func(string, int) inbox.Progress { return 0 }
	g := newEffectsInbox(t, h, engine.Config{MaxAttempts: 2})
	r, err := g.inbox.Process(context.Background(), message.NewMessage(watermill.NewUUID(), []byte("forgot")), inbox.Source{Topic: "grouped"}, engine.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonRetriesExhausted || !errors.Is(r.Err, inbox.ErrInvalidProgress) {
		t.Fatalf("result %+v, want quarantined after the invalid Progress", r)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM grouped_effect"); n != 0 {
		t.Fatalf("%d effects committed by attempts that returned an invalid Progress", n)
	}
	if n := h.callsOf("forgot"); n != 2 {
		t.Fatalf("Handle called %d times, want 2 (inbox.max_attempts)", n)
	}
}

// okBatch is a BatchHandler whose HandleBatch forgets to fill its result, so every slot is
// the zero Progress. Handle does the work.
type okBatch struct{ *effects }

func (okBatch) HandleBatch(_ context.Context, _ *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	return make([]inbox.Progress, len(ds)), nil
}

// TestBatchZeroProgressIsNotDone checks that a HandleBatch that returns a zero Progress
// for a delivery has not done it. The delivery is not marked done, but runs one at a time.
// So its work happens exactly once.
func TestBatchZeroProgressIsNotDone(t *testing.T) {
	h := okBatch{newEffects()}
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{Linger: 50 * time.Millisecond})
	if o := outcomes(g.send(t, keys("zero", 20))); o["processed"] != 20 {
		t.Fatalf("outcomes %v", o)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM grouped_effect"); n != 20 {
		t.Fatalf("%d effects, want 20: a delivery was marked done without its work", n)
	}
	if st := g.b.Stats(); st.InvalidProgress != 20 || st.Fallbacks != 20 {
		t.Fatalf("stats %+v: want 20 invalid slots fallen back", st)
	}
}

package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestNULBytes checks that a NUL byte, which no PostgreSQL text column stores, never leaves
// a record unrecorded. A business key holding one is poison on PostgreSQL, while MariaDB
// stores and runs it. A message id, an error text or a fingerprint holding one is stored
// with U+FFFD instead, alike for each delivery, on every database.
func TestNULBytes(t *testing.T) {
	h := newEffects()
	h.misbehave = func(_ context.Context, key string, _ int) error {
		if key == "err" {
			return errors.New("bad\x00byte")
		}
		return nil
	}
	g := newGrouped(t, h, engine.Config{MaxAttempts: 2}, engine.BatchConfig{})
	ctx := context.Background()
	pg := testenv.Dialect().IsPostgres()
	key := "nul\x00key"
	for i := range 2 {
		r, err := g.inbox.Process(ctx, message.NewMessage("id\x00"+strconv.Itoa(i), []byte(key)), inbox.Source{Topic: "grouped", Offset: int64(i)}, engine.ProcessOptions{})
		if err != nil {
			t.Fatalf("key with a NUL, delivery %d: %v", i, err)
		}
		want := engine.Result{Outcome: engine.OutcomeProcessed, Key: key}
		if i == 1 {
			want.Outcome = engine.OutcomeDuplicate
		}
		if pg {
			want = engine.Result{Outcome: engine.OutcomeQuarantined, Key: fmt.Sprintf("poison:grouped/0/%d", i), Reason: engine.ReasonPoison}
		}
		if r.Outcome != want.Outcome || r.Key != want.Key || r.Reason != want.Reason {
			t.Errorf("key with a NUL, delivery %d: %+v, want %+v", i, r, want)
		}
	}
	rs := g.send(t, []string{"err", "fine"})
	if rs[0].Outcome != engine.OutcomeQuarantined || rs[0].Reason != engine.ReasonRetriesExhausted || rs[1].Outcome != engine.OutcomeProcessed {
		t.Fatalf("outcomes %+v, want err quarantined (retries exhausted) and fine processed", rs)
	}
	var lastErr, uuid string
	if err := g.db.DB.QueryRow(testenv.Rebind("SELECT last_error, message_uuid FROM inbox WHERE id = ?"), rs[0].InboxID).Scan(&lastErr, &uuid); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "bad\uFFFDbyte") {
		t.Errorf("last_error %q, want the error text with U+FFFD for its NUL", lastErr)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM inbox WHERE message_uuid = ?", "id\uFFFD0"); n != 1 {
		t.Errorf("%d rows with message id %q, want 1", n, "id\uFFFD0")
	}
}

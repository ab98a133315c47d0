package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

// A relay starting on a fresh (reset or restored) database finds, in the positions topic,
// the last batch another database committed under the same transactional id. Its outbox ids
// exist in the new table but are other events: they must be published, not marked as
// already in Kafka (that would lose them).
func TestEOSRelayIgnoresPositionOfAnotherDatabase(t *testing.T) {
	ctx := context.Background()
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-eos-foreign", 3)
	cfg := eosConfig(t, k, outbox.RelayConfig{})
	w := newWriter(t)
	events := func(prefix string) ([]outbox.Event, []string) {
		var evs []outbox.Event
		var ids []string
		for i := range 10 {
			id := watermill.NewUUID()
			evs = append(evs, outbox.Event{ID: id, Type: "Test", Topic: topic, Key: fmt.Sprintf("%s-%d", prefix, i), Payload: []byte(prefix)})
			ids = append(ids, id)
		}
		return evs, ids
	}
	drain := func(db testenv.Database, r *outbox.Relay) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for pendingRows(t, db.DB) > 0 {
			if _, err := r.RelayOnce(ctx); err != nil {
				t.Logf("relay: %v", err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d rows still unpublished", pendingRows(t, db.DB))
			}
		}
	}

	old := testenv.DB(t, 4)
	evs1, ids1 := events("old")
	addCommitted(t, ctx, old.DB, w, evs1...)
	r1 := newEOSRelay(t, old.DB, k, cfg)
	drain(old, r1)
	_ = r1.Close()

	fresh := testenv.DB(t, 4) // same ids 1..10, other events
	evs2, ids2 := events("fresh")
	addCommitted(t, ctx, fresh.DB, w, evs2...)
	r2 := newEOSRelay(t, fresh.DB, k, cfg)
	drain(fresh, r2)
	if r2.Reconciled() != 0 {
		t.Fatalf("the new relay reconciled %d rows from another database's position", r2.Reconciled())
	}
	assertExactlyOnce(t, readAll(t, k, topic), append(ids1, ids2...))
}

package outbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

// A relay starting on a fresh database, reset or restored, finds in the positions topic the
// last batch that another database committed under the same transactional id. Its outbox
// ids exist in the new table but are other events. They must be published, not marked as
// already in Kafka, which would lose them.
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

// After `router migrate --reset` every `router relay` start finds the old batch. Here a
// fresh database takes the transactional id that another one published with. Each start
// says so once at WARN, with what to do, and logs no error. Once the relay has published a
// batch of this database, a start finds that one and says nothing.
func TestRelayAfterResetWarnsOncePerStart(t *testing.T) {
	ctx := context.Background()
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-reset-warn", 1)
	cfg := eosConfig(t, k, outbox.RelayConfig{})
	w := newWriter(t)
	event := func(key string) outbox.Event {
		return outbox.Event{ID: watermill.NewUUID(), Type: "Test", Topic: topic, Key: key, Payload: []byte(key)}
	}

	old := testenv.DB(t, 4)
	addCommitted(t, ctx, old.DB, w, event("old-1"), event("old-2"))
	r := newEOSRelay(t, old.DB, k, cfg)
	for deadline := time.Now().Add(60 * time.Second); pendingRows(t, old.DB) > 0; {
		if _, err := r.RelayOnce(ctx); err != nil {
			t.Logf("relay: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows of the old database still unpublished", pendingRows(t, old.DB))
		}
	}
	_ = r.Close()

	reset := testenv.DB(t, 4)
	env := relayEnv(reset, k, cfg.TransactionalID, cfg.PositionsTopic, "reset-owner", nil)
	// start runs `router relay` until its session has started, and, if it must, until the
	// database has no unpublished row. It returns the relay's log.
	start := func(name string, drain bool) string {
		t.Helper()
		p := startRelayProc(t, name, env)
		deadline := time.Now().Add(90 * time.Second)
		for !strings.Contains(p.logText(t), "outbox relay session started") || drain && pendingRows(t, reset.DB) > 0 {
			if p.wait(100 * time.Millisecond) {
				t.Fatalf("%s exited (%v):\n%s", name, p.err, p.tail(t, 20))
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no session started or rows still unpublished after 90s:\n%s", name, p.tail(t, 20))
			}
		}
		_ = p.cmd.Process.Signal(os.Interrupt)
		if !p.wait(60 * time.Second) {
			t.Fatalf("%s did not stop on SIGINT", name)
		}
		return p.logText(t)
	}
	warnings := func(log string) (warn, errs []string) {
		for _, line := range strings.Split(log, "\n") {
			switch {
			case strings.Contains(line, "level=WARN") && strings.Contains(line, "not of this database's outbox rows"):
				warn = append(warn, line)
			case strings.Contains(line, "level=ERROR"):
				errs = append(errs, line)
			}
		}
		return warn, errs
	}
	for i := 1; i <= 2; i++ { // nothing published in between: each start says it again
		log := start(fmt.Sprintf("after-reset-%d", i), false)
		warn, errs := warnings(log)
		if len(warn) != 1 || len(errs) != 0 {
			t.Fatalf("start %d after the reset: warnings %q, errors %q; want one warning and no error\n%s", i, warn, errs, log)
		}
		for _, want := range []string{"router migrate --reset", "nothing needs doing", "relay.transactional_id", "harmless"} {
			if !strings.Contains(warn[0], want) {
				t.Errorf("the warning lacks %q: %s", want, warn[0])
			}
		}
	}
	addCommitted(t, ctx, reset.DB, w, event("new-1"))
	if warn, _ := warnings(start("publishes", true)); len(warn) != 1 {
		t.Fatalf("the start that publishes the reset database's first batch: %d warnings, want 1", len(warn))
	}
	if warn, errs := warnings(start("after-publishing", false)); len(warn) != 0 || len(errs) != 0 {
		t.Fatalf("a start after the relay published a batch of this database: warnings %q, errors %q; want none", warn, errs)
	}
}

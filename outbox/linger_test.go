package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

// lingerScenario commits one event, then runs one RelayOnce. Its "linger" hook commits four
// more events from another connection while the relay waits. lingerScenario returns the
// ids and what RelayOnce published.
func lingerScenario(t *testing.T, db *sql.DB, topic string, cfg outbox.RelayConfig, build func(outbox.RelayConfig) *outbox.Relay) (ids []string, n int, r *outbox.Relay) {
	t.Helper()
	ctx := context.Background()
	w := newWriter(t)
	ev := func(i int) outbox.Event {
		id := fmt.Sprintf("linger-%d", i)
		ids = append(ids, id)
		return outbox.Event{ID: id, Type: "T", Topic: topic, Key: "k", Payload: []byte(id)}
	}
	addCommitted(t, ctx, db, w, ev(0))
	hooked := 0
	cfg.Hook = func(point string) {
		if point != "linger" {
			return
		}
		hooked++
		// The relay waits here, and more business transactions commit meanwhile.
		for i := 1; i <= 4; i++ {
			addCommitted(t, ctx, db, w, ev(i))
		}
	}
	r = build(cfg)
	n, err := r.RelayOnce(ctx)
	if err != nil {
		t.Fatalf("RelayOnce: %v", err)
	}
	if cfg.Linger > 0 && hooked != 1 {
		t.Fatalf("linger hook ran %d times, want 1", hooked)
	}
	return ids, n, r
}

// TestRelayLingerFillsPartialBatch checks that a batch that found one row waits Linger, and
// that rows that commit meanwhile go out in the same batch. Without linger the same
// RelayOnce publishes the one row alone. That comparison shows the setting has an effect.
func TestRelayLingerFillsPartialBatch(t *testing.T) {
	for _, linger := range []time.Duration{outbox.NoLinger, 20 * time.Millisecond} {
		t.Run(fmt.Sprint("linger=", linger), func(t *testing.T) {
			d := testenv.DB(t, 4)
			p := &fakeProducer{}
			ids, n, r := lingerScenario(t, d.DB, "t", outbox.RelayConfig{BatchSize: 10, Linger: linger},
				func(c outbox.RelayConfig) *outbox.Relay { return newRelay(t, d.DB, p, c) })
			calls, sent := p.snapshot()
			want := 1
			if linger > 0 {
				want = 5
			}
			if n != want || calls != 1 || len(sent) != want || r.Batches() != 1 {
				t.Fatalf("RelayOnce published %d in %d producer calls (%d messages, %d batches); want %d in 1", n, calls, len(sent), r.Batches(), want)
			}
			for i, m := range sent {
				if got := headerValue(m, outbox.HeaderEventID); got != ids[i] {
					t.Fatalf("message %d is %s, want %s (id order)", i, got, ids[i])
				}
			}
			if linger > 0 && r.Lingers() != 1 {
				t.Fatalf("Lingers = %d, want 1", r.Lingers())
			}
		})
	}
}

// TestRelayLingerFullBatchDoesNotWait checks that a full batch is published at once. The
// hook would fail the test if the relay lingered.
func TestRelayLingerFullBatchDoesNotWait(t *testing.T) {
	d := testenv.DB(t, 4)
	addN(t, d.DB, "t", "full", 5)
	cfg := outbox.RelayConfig{BatchSize: 5, Linger: time.Second, Hook: func(p string) {
		if p == "linger" {
			t.Errorf("a full batch lingered")
		}
	}}
	r := newRelay(t, d.DB, &fakeProducer{}, cfg)
	if n, err := r.RelayOnce(context.Background()); n != 5 || err != nil || r.Lingers() != 0 {
		t.Fatalf("RelayOnce = %d, %v (lingers %d); want 5, nil, 0", n, err, r.Lingers())
	}
}

// TestEOSRelayLingerFillsPartialBatch checks the same on the exactly-once relay and the
// real broker. Five events go in one Kafka transaction, each once for a read_committed
// reader. Before lingering, the relay counts the pending rows by their ids alone. It reads
// them in full once, after the linger. So the batch costs one full read, and the payload a
// row has after the linger is the one published.
func TestEOSRelayLingerFillsPartialBatch(t *testing.T) {
	t.Parallel()
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-linger", 1)
	cfg := eosConfig(t, k, outbox.RelayConfig{BatchSize: 10, Linger: 20 * time.Millisecond})
	reads := 0
	ids, n, r := lingerScenario(t, d.DB, topic, cfg, func(c outbox.RelayConfig) *outbox.Relay {
		add := c.Hook
		c.Hook = func(point string) {
			switch point {
			case "read":
				reads++
			case "linger":
				if _, err := d.DB.Exec("UPDATE outbox SET payload = 'changed' WHERE event_id = 'linger-0'"); err != nil {
					t.Errorf("change the first row: %v", err)
				}
			}
			add(point)
		}
		return newEOSRelay(t, d.DB, k, c)
	})
	if n != 5 || r.Batches() != 1 || reads != 1 {
		t.Fatalf("RelayOnce published %d events in %d Kafka transactions with %d full reads; want 5 in 1 with 1", n, r.Batches(), reads)
	}
	if got := positionRecords(t, cfg); got != 1 {
		t.Fatalf("%d batch positions committed to Kafka, want 1", got)
	}
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	for _, rec := range recs {
		want := rec.Headers[outbox.HeaderEventID]
		if want == "linger-0" {
			want = "changed"
		}
		if string(rec.Value) != want {
			t.Errorf("event %s published with payload %q, want %q (the rows as they are after the linger)", rec.Headers[outbox.HeaderEventID], rec.Value, want)
		}
	}
}

// positionRecords counts the committed batch positions of cfg's transactional id. There is
// one per Kafka transaction that carried events. Init records have another key.
func positionRecords(t *testing.T, cfg outbox.RelayConfig) int {
	t.Helper()
	n := 0
	for _, rec := range readAll(t, testenv.Kafka(t), cfg.PositionsTopic) {
		if rec.Key == cfg.TransactionalID {
			n++
		}
	}
	return n
}

// TestEOSRelayLingerFewerTransactions sends the same trickle of single-event business
// transactions through two exactly-once relays side by side, one with linger and one
// without. Each has its own database and topic, so both see the same load at the same
// time. Kafka's committed batch positions count one per transaction. The lingering relay
// needs fewer transactions for the same events. Nothing about time is asserted. Every
// event is on Kafka exactly once in both runs.
func TestEOSRelayLingerFewerTransactions(t *testing.T) {
	t.Parallel()
	const events = 300
	k := testenv.Kafka(t)
	type run struct {
		linger time.Duration
		d      testenv.Database
		topic  string
		cfg    outbox.RelayConfig
		relay  *outbox.Relay
		ids    []string
	}
	runs := []*run{{linger: outbox.NoLinger}, {linger: 100 * time.Millisecond}}
	for _, r := range runs {
		r.d = testenv.DB(t, 4)
		r.topic = testenv.Topic(t, k, "outbox-trickle", 2)
		r.cfg = eosConfig(t, k, outbox.RelayConfig{BatchSize: 2000, PollInterval: 5 * time.Millisecond, Linger: r.linger})
		r.relay = newEOSRelay(t, r.d.DB, k, r.cfg)
	}
	var wg sync.WaitGroup
	for _, r := range runs {
		stop := runRelay(t, r.relay)
		wg.Go(func() {
			defer stop()
			w := newWriter(t)
			// Warm up, so the first session's producer id and init position are done before
			// the trickle.
			addCommitted(t, context.Background(), r.d.DB, w, outbox.Event{ID: "warm-up", Type: "T", Topic: r.topic, Key: "w", Payload: []byte("w")})
			r.ids = append(r.ids, "warm-up")
			waitAllPublished(t, r.d.DB, 1, 60*time.Second)
			start := time.Now()
			for i := range events {
				id := fmt.Sprintf("trickle-%04d", i)
				addCommitted(t, context.Background(), r.d.DB, w, outbox.Event{ID: id, Type: "T", Topic: r.topic, Key: fmt.Sprintf("k%d", i%7), Payload: []byte(id)})
				r.ids = append(r.ids, id)
				time.Sleep(2 * time.Millisecond) // a trickle, not a burst
			}
			waitAllPublished(t, r.d.DB, events+1, 60*time.Second)
			t.Logf("linger %s: trickle of %d events relayed in %s", r.linger, events, time.Since(start).Round(time.Millisecond))
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	txns := make([]int, len(runs))
	for i, r := range runs {
		txns[i] = positionRecords(t, r.cfg)
		if int64(txns[i]) != r.relay.Batches() || txns[i] < 2 {
			t.Errorf("linger %s: %d batch positions on Kafka, relay counted %d batches", r.linger, txns[i], r.relay.Batches())
		}
		assertExactlyOnce(t, readAll(t, k, r.topic), r.ids)
		txns[i]-- // the warm-up event's own transaction
		t.Logf("linger %-6s: %d events in %d Kafka transactions (%.1f per transaction), %d lingers",
			r.linger, events, txns[i], float64(events)/float64(txns[i]), r.relay.Lingers())
	}
	if runs[1].relay.Lingers() == 0 {
		t.Fatalf("the relay with linger %s never lingered", runs[1].linger)
	}
	if txns[1] >= txns[0] {
		t.Fatalf("with linger %s the relay used %d Kafka transactions for %d events, without %d: linger had no effect",
			runs[1].linger, txns[1], events, txns[0])
	}
}

package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// A relay mode of the parking tests.
type parkMode struct {
	name  string
	relay func(t *testing.T, db *sql.DB, k kafkax.Config) *outbox.Relay
}

func parkModes() []parkMode {
	return []parkMode{
		{"at-least-once", func(t *testing.T, db *sql.DB, k kafkax.Config) *outbox.Relay {
			client, p := clientProducer(t, k)
			return newRelay(t, db, p, outbox.RelayConfig{BatchSize: 500, PollInterval: 5 * time.Millisecond}).
				CheckWith(client, client.Config().Producer.MaxMessageBytes)
		}},
		{"exactly-once", func(t *testing.T, db *sql.DB, k kafkax.Config) *outbox.Relay {
			return newEOSRelay(t, db, k, eosConfig(t, k, outbox.RelayConfig{BatchSize: 500, PollInterval: 5 * time.Millisecond}))
		}},
		{"exactly-once, 3 shards", func(t *testing.T, db *sql.DB, k kafkax.Config) *outbox.Relay {
			return newEOSRelay(t, db, k, eosConfig(t, k, outbox.RelayConfig{BatchSize: 500, PollInterval: 5 * time.Millisecond,
				Shards: 3, Owner: "solo"}))
		}},
	}
}

// clientProducer is an idempotent producer on a client of its own, which answers the
// relay's metadata checks. Both are closed when the test ends.
func clientProducer(t testing.TB, k kafkax.Config) (sarama.Client, sarama.SyncProducer) {
	t.Helper()
	client, err := sarama.NewClient(k.Brokers, k.ProducerConfig())
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		client.Close()
		t.Fatalf("producer: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Close()
		_ = client.Close()
	})
	return client, p
}

func uniqueName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// createTopic creates topic with config entries. The topic is deleted when the test ends.
func createTopic(t testing.TB, k kafkax.Config, topic string, partitions int32, config map[string]string) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	admin, err := sarama.NewClusterAdmin(k.Brokers, sc)
	if err != nil {
		t.Fatalf("kafka admin: %v", err)
	}
	entries := map[string]*string{}
	for key, v := range config {
		entries[key] = &v
	}
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: entries}, false); err != nil {
		admin.Close()
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		_ = admin.DeleteTopic(topic)
		admin.Close()
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if parts, err := k.CheckTopics(topic); err == nil && parts[topic] == int(partitions) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s not ready", topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// writeEvents stores events through outbox.Writer, 500 per transaction.
func writeEvents(t testing.TB, db *sql.DB, evs []outbox.Event) {
	t.Helper()
	w := newWriter(t)
	ctx := context.Background()
	for start := 0; start < len(evs); start += 500 {
		chunk := evs[start:min(start+500, len(evs))]
		if err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
			for _, e := range chunk {
				if err := w.Add(ctx, tx, e); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("write events: %v", err)
		}
	}
}

func parkedCount(t testing.TB, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox_parked").Scan(&n); err != nil {
		t.Fatalf("count parked rows: %v", err)
	}
	return n
}

// waitSettled waits, up to bound, until no outbox row is pending and parked rows are
// parked.
func waitSettled(t testing.TB, db *sql.DB, parked int, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		pending, p := pendingRows(t, db), parkedCount(t, db)
		if pending == 0 && p == parked {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d outbox rows pending, %d parked (want 0 and %d)", bound, pending, p, parked)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// idsOf returns the event ids of evs that go to topic, except those in but.
func idsOf(evs []outbox.Event, topic string, but ...string) []string {
	var out []string
	for _, e := range evs {
		if e.Topic == topic && !slices.Contains(but, e.ID) {
			out = append(out, e.ID)
		}
	}
	return out
}

// TestRelayParksEventsForMissingTopic writes an outbox event for a topic that does not
// exist, among 10,000 events of two good topics. Every good event is published exactly
// once. The bad one is parked with an error naming its topic. The later events of its key
// are held behind it, in the same batch and in later ones. Once the topic exists, a retry
// publishes the parked event and the events behind it once, in their order. The retry
// takes the path of `router outbox retry`.
func TestRelayParksEventsForMissingTopic(t *testing.T) {
	for _, m := range parkModes() {
		t.Run(m.name, func(t *testing.T) {
			d := testenv.DB(t, 8)
			k := testenv.Kafka(t)
			good := []string{testenv.Topic(t, k, "park-good-a", 3), testenv.Topic(t, k, "park-good-b", 3)}
			missing := uniqueName("park-missing")
			evs := make([]outbox.Event, 10000)
			for i := range evs {
				evs[i] = outbox.Event{ID: fmt.Sprintf("ev-%05d", i), Type: "T", Topic: good[i%2], Key: fmt.Sprintf("k-%d", i%300),
					Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
			}
			const badKey = "k-bad\x1b[31m" // control characters reach the logs and the CLI escaped
			set := func(i int, id, topic string) {
				evs[i] = outbox.Event{ID: id, Type: "T", Topic: topic, Key: badKey, Payload: []byte(id)}
			}
			set(100, "bad-00100", missing)
			set(101, "held-00101", missing) // same batch as the bad one
			set(2000, "held-02000", missing)
			set(6000, "held-06000", good[0]) // held although its own topic exists
			set(9000, "held-09000", missing)
			held := []string{"held-00101", "held-02000", "held-06000", "held-09000"}

			relay := m.relay(t, d.DB, k)
			stop := runRelay(t, relay)
			writeEvents(t, d.DB, evs)
			waitSettled(t, d.DB, 5, 3*time.Minute)
			stop()

			for _, topic := range good {
				assertExactlyOnce(t, readAll(t, k, topic), idsOf(evs, topic, held...))
			}
			store, err := outbox.NewParked(d.DB, "")
			if err != nil {
				t.Fatal(err)
			}
			rows, err := store.List(context.Background(), 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rows {
				got = append(got, r.EventID)
				if r.Key != badKey {
					t.Errorf("parked %s has key %q, want %q", r.EventID, r.Key, badKey)
				}
			}
			if want := append([]string{"bad-00100"}, held...); !slices.Equal(got, want) {
				t.Fatalf("parked events %v, want %v", got, want)
			}
			head := rows[0]
			if head.Reason != outbox.ReasonUnknownTopic || head.HeldBehind != "" || head.Holding != 4 {
				t.Errorf("parked event: reason %q, held behind %q, holding %d; want %q, none, 4", head.Reason, head.HeldBehind, head.Holding, outbox.ReasonUnknownTopic)
			}
			for _, w := range []string{missing, "bad-00100", "does not exist"} {
				if !strings.Contains(head.Error, w) {
					t.Errorf("parked event's error %q does not name %q", head.Error, w)
				}
			}
			for _, r := range rows[1:] {
				if r.Reason != outbox.ReasonHeld || r.HeldBehind != "bad-00100" || !strings.Contains(r.Error, "bad-00100") {
					t.Errorf("held %s: reason %q, held behind %q, error %q; want held behind bad-00100", r.EventID, r.Reason, r.HeldBehind, r.Error)
				}
			}
			if relay.Parked() != 5 {
				t.Errorf("relay counted %d parked rows, want 5", relay.Parked())
			}
			if _, err := store.Retry(context.Background(), "held-02000"); !errors.Is(err, outbox.ErrHeld) {
				t.Errorf("retry of a held event: %v, want ErrHeld", err)
			}

			// The topic appears; retry the parked event.
			createTopic(t, k, missing, 1, nil)
			rel, err := store.Retry(context.Background(), "bad-00100")
			if err != nil || rel.Moved != 5 || rel.Event.EventID != "bad-00100" {
				t.Fatalf("Retry = %+v, %v; want the event and 4 held ones moved back", rel, err)
			}
			if _, err := store.Retry(context.Background(), "bad-00100"); !errors.Is(err, outbox.ErrNotParked) {
				t.Errorf("second retry: %v, want ErrNotParked", err)
			}
			relay2 := m.relay(t, d.DB, k)
			stop = runRelay(t, relay2)
			waitAllPublished(t, d.DB, len(evs), 2*time.Minute)
			stop()
			if n := parkedCount(t, d.DB); n != 0 {
				t.Fatalf("%d rows still parked after the retry", n)
			}
			recs := readAll(t, k, missing)
			wantMissing := []string{"bad-00100", "held-00101", "held-02000", "held-09000"}
			assertExactlyOnce(t, recs, wantMissing)
			var order []string
			for _, r := range recs {
				order = append(order, r.Headers[outbox.HeaderEventID])
			}
			if !slices.Equal(order, wantMissing) {
				t.Fatalf("order on %s: %v, want %v", missing, order, wantMissing)
			}
			assertExactlyOnce(t, readAll(t, k, good[0]), idsOf(evs, good[0]))
			assertExactlyOnce(t, readAll(t, k, good[1]), idsOf(evs, good[1]))
		})
	}
}

// TestRelayParksOversizedRecord checks that a record over the producer's max message bytes
// is parked with reason too_large and not retried forever. The later event of its key is
// held. Drop deletes the record and releases the held one. The case "refused at send" runs
// without the check before sending. The producer's own size check refuses the record, and
// that refusal parks it. The later event of its key, acked in the same batch, is held all
// the same. It is published again after the record, at least once and so twice in all.
func TestRelayParksOversizedRecord(t *testing.T) {
	modes := append(parkModes(), parkMode{"at-least-once, refused at send", func(t *testing.T, db *sql.DB, k kafkax.Config) *outbox.Relay {
		return newRelay(t, db, newProducer(t, k), outbox.RelayConfig{PollInterval: 5 * time.Millisecond})
	}})
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			d := testenv.DB(t, 4)
			k := testenv.Kafka(t)
			topic := testenv.Topic(t, k, "park-big", 1)
			big := bytes.Repeat([]byte("x"), 1<<20+100) // over Sarama's default Producer.MaxMessageBytes (1 MiB)
			evs := []outbox.Event{
				{ID: "small-1", Type: "T", Topic: topic, Key: "a", Payload: []byte("1")},
				{ID: "big-2", Type: "T", Topic: topic, Key: "b", Payload: big},
				{ID: "small-3", Type: "T", Topic: topic, Key: "c", Payload: []byte("3")},
				{ID: "after-big-4", Type: "T", Topic: topic, Key: "b", Payload: []byte("4")},
				{ID: "small-5", Type: "T", Topic: topic, Key: "a", Payload: []byte("5")},
			}
			writeEvents(t, d.DB, evs)
			relay := m.relay(t, d.DB, k)
			stop := runRelay(t, relay)
			waitSettled(t, d.DB, 2, time.Minute)
			stop()
			atSend := strings.HasSuffix(m.name, "at send")
			want := []string{"small-1", "small-3", "small-5"}
			if atSend {
				want = append(want, "after-big-4")
			}
			assertExactlyOnce(t, readAll(t, k, topic), want)
			store, err := outbox.NewParked(d.DB, "")
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			p, err := store.Get(ctx, "big-2")
			if err != nil {
				t.Fatal(err)
			}
			if p.Reason != outbox.ReasonTooLarge || p.Size != len(big) || !bytes.Equal(p.Payload, big) || !strings.Contains(p.Error, "MaxMessageBytes") {
				t.Errorf("parked big-2: reason %q, %d bytes, error %q; want too_large, %d bytes, an error naming MaxMessageBytes", p.Reason, p.Size, p.Error, len(big))
			}
			if h, err := store.Get(ctx, "after-big-4"); err != nil || h.HeldBehind != "big-2" {
				t.Fatalf("after-big-4: %+v %v; want held behind big-2", h, err)
			}
			if _, err := store.Drop(ctx, "after-big-4"); !errors.Is(err, outbox.ErrHeld) {
				t.Errorf("drop of a held event: %v, want ErrHeld", err)
			}
			rel, err := store.Drop(ctx, fmt.Sprint(p.ID)) // by outbox id
			if err != nil || rel.Moved != 1 || rel.Event.EventID != "big-2" {
				t.Fatalf("Drop = %+v, %v; want big-2 dropped, 1 event released", rel, err)
			}
			stop = runRelay(t, m.relay(t, d.DB, k))
			waitSettled(t, d.DB, 0, time.Minute)
			stop()
			recs := readAll(t, k, topic)
			if atSend {
				if last := recs[len(recs)-1].Headers[outbox.HeaderEventID]; len(recs) != 5 || last != "after-big-4" {
					t.Fatalf("%d records, the last %s; want 5, the held after-big-4 published again last", len(recs), last)
				}
				recs = recs[:4]
			}
			assertExactlyOnce(t, recs, []string{"small-1", "small-3", "small-5", "after-big-4"})
			if n := countRows(t, d.DB, "event_id = 'big-2'"); n != 0 {
				t.Fatalf("dropped event is back in the outbox (%d rows)", n)
			}
		})
	}
}

// TestRelayParksEventBrokerRefuses writes a record over the topic's max.message.bytes. The
// broker refuses it, although the producer let it through. Nothing tells which record of
// the batch it was. The broker fails the partition's whole record batch, and a
// transactional producer fails every record after it. So the relay narrows it down over the
// next batches and parks it. A read_committed reader sees every other event exactly once.
// The later event of its key is held. In at-least-once mode that event was acked beside
// the refused one. It is held all the same, to go out again after it.
func TestRelayParksEventBrokerRefuses(t *testing.T) {
	for _, m := range parkModes()[:2] {
		t.Run(m.name, func(t *testing.T) {
			if m.name == "exactly-once" && runWithoutRace(t) { // the refusal takes Sarama's transactional error path
				return
			}
			d := testenv.DB(t, 4)
			k := testenv.Kafka(t)
			good := testenv.Topic(t, k, "park-good", 3)
			small := uniqueName("park-small-limit")
			createTopic(t, k, small, 1, map[string]string{"max.message.bytes": "2000"})
			var evs []outbox.Event
			for i := range 300 {
				evs = append(evs, outbox.Event{ID: fmt.Sprintf("ev-%03d", i), Type: "T", Topic: good, Key: fmt.Sprintf("k-%d", i%40), Payload: []byte("ok")})
			}
			evs[50] = outbox.Event{ID: "too-big", Type: "T", Topic: small, Key: "k-big", Payload: bytes.Repeat([]byte("y"), 5000)}
			evs[60] = outbox.Event{ID: "small-ok", Type: "T", Topic: small, Key: "k-other", Payload: []byte("fits")}
			evs[120] = outbox.Event{ID: "behind-big", Type: "T", Topic: good, Key: "k-big", Payload: []byte("after")}
			writeEvents(t, d.DB, evs)
			relay := m.relay(t, d.DB, k)
			stop := runRelay(t, relay)
			waitSettled(t, d.DB, 2, 2*time.Minute)
			stop()
			want := idsOf(evs, good, "behind-big")
			if m.name == "at-least-once" {
				// Kafka acked it in the batch in which it refused too-big. It is held all the
				// same and goes out again after too-big, at least once.
				want = append(want, "behind-big")
			}
			assertExactlyOnce(t, readAll(t, k, good), want)
			assertExactlyOnce(t, readAll(t, k, small), []string{"small-ok"})
			store, _ := outbox.NewParked(d.DB, "")
			p, err := store.Get(context.Background(), "too-big")
			if err != nil {
				t.Fatal(err)
			}
			if p.Reason != outbox.ReasonTooLarge || !strings.Contains(p.Error, small) || !strings.Contains(p.Error, "too large") {
				t.Errorf("parked too-big: reason %q, error %q; want too_large with the broker's error and the topic", p.Reason, p.Error)
			}
			if h, err := store.Get(context.Background(), "behind-big"); err != nil || h.HeldBehind != "too-big" {
				t.Fatalf("behind-big: %+v %v; want held behind too-big", h, err)
			}
		})
	}
}

// TestParkedStoreRefs checks that the Parked store refuses an unknown or malformed reference
// without changing anything.
func TestParkedStoreRefs(t *testing.T) {
	d := testenv.DB(t, 2)
	store, err := outbox.NewParked(d.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ref := range []string{"", strings.Repeat("x", 37), "42", "no-such-event"} {
		if _, err := store.Retry(ctx, ref); err == nil {
			t.Errorf("Retry(%q) succeeded", ref)
		}
		if _, err := store.Drop(ctx, ref); err == nil {
			t.Errorf("Drop(%q) succeeded", ref)
		}
	}
	if _, err := store.Get(ctx, "42"); !errors.Is(err, outbox.ErrNotParked) {
		t.Errorf("Get(42) = %v, want ErrNotParked", err)
	}
	if _, err := outbox.NewParked(d.DB, "outbox; DROP"); err == nil {
		t.Error("NewParked accepted an invalid table name")
	}
}

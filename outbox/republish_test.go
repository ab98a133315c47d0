package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// recreateTopic deletes topic and creates it again, empty, with partitions. Kafka deletes
// a topic in the background, so the creation is retried until the name is free.
func recreateTopic(t testing.TB, k kafkax.Config, topic string, partitions int32) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	admin, err := sarama.NewClusterAdmin(k.Brokers, sc)
	if err != nil {
		t.Fatalf("kafka admin: %v", err)
	}
	defer admin.Close()
	if err := admin.DeleteTopic(topic); err != nil {
		t.Fatalf("delete topic %s: %v", topic, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
		if err == nil {
			break
		}
		if !errors.Is(err, sarama.ErrTopicAlreadyExists) || time.Now().After(deadline) {
			t.Fatalf("create topic %s again: %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Ready once every partition's leader answers a read.
	for {
		parts, err := k.CheckTopics(topic)
		if err == nil && parts[topic] == int(partitions) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = k.ReadAll(ctx, topic, 100*time.Millisecond)
			cancel()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s not ready after its creation: %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRepublishAfterTopicRecreated publishes 3,000 events of 100 keys, with headers, to a
// topic and 500 to another, then deletes the topic and creates it again: its records are
// gone. Republish from before the first event sends the topic's events again from the
// outbox's published rows: the same event ids, keys, values and headers, each key's events
// on the partition they had and in their order, nothing of the other topic. PlanRepublish
// counts them, and a time range chooses the later events only.
func TestRepublishAfterTopicRecreated(t *testing.T) {
	if runWithoutRace(t) { // a transactional producer's error paths, IBM/sarama#2913
		return
	}
	d := testenv.DB(t, 8)
	k := testenv.Kafka(t)
	ctx := context.Background()
	topic := uniqueName("republish")
	createTopic(t, k, topic, 3, nil)
	other := testenv.Topic(t, k, "republish-other", 1)
	relay := newEOSRelay(t, d.DB, k, eosConfig(t, k, outbox.RelayConfig{BatchSize: 500, PollInterval: 5 * time.Millisecond}))
	stop := runRelay(t, relay)

	var evs []outbox.Event
	seq := map[string]int{}
	write := func(n int) {
		t.Helper()
		var batch []outbox.Event
		for range n {
			key := fmt.Sprintf("k-%02d", len(evs)%100)
			seq[key]++
			p, _ := json.Marshal(seqPayload{Key: key, Seq: seq[key]})
			e := outbox.Event{ID: outbox.EventID(topic, key, fmt.Sprint(seq[key])), Type: "Republished", Topic: topic, Key: key, Payload: p,
				Headers: map[string]string{"tenant": "acme"}}
			evs, batch = append(evs, e), append(batch, e)
		}
		for i := range 500 * (n / 1500) {
			batch = append(batch, outbox.Event{ID: fmt.Sprintf("other-%d-%d", len(evs), i), Type: "Other", Topic: other, Key: "o", Payload: []byte("o")})
		}
		writeEvents(t, d.DB, batch)
		waitAllPublished(t, d.DB, countRows(t, d.DB, "1=1"), 2*time.Minute)
	}
	write(1500)
	var mid time.Time
	if err := d.DB.QueryRow("SELECT MAX(published_at) FROM outbox").Scan(&mid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	write(1500)
	stop()
	before := readAll(t, k, topic)
	if len(before) != len(evs) {
		t.Fatalf("%d records on %s before it is deleted, want %d", len(before), topic, len(evs))
	}

	recreateTopic(t, k, topic, 3)
	if recs := readAll(t, k, topic); len(recs) != 0 {
		t.Fatalf("%d records on the recreated topic, want none", len(recs))
	}
	since := time.Now().Add(-time.Hour)
	plan, err := outbox.PlanRepublish(ctx, d.DB, outbox.RepublishConfig{Topic: topic, Since: since})
	if err != nil || plan.Events != int64(len(evs)) || plan.Unpublished != 0 || plan.Oldest.IsZero() || plan.Oldest.After(plan.First) {
		t.Fatalf("PlanRepublish = %+v, %v; want %d events, none unpublished", plan, err, len(evs))
	}
	later, err := outbox.PlanRepublish(ctx, d.DB, outbox.RepublishConfig{Topic: topic, Since: mid.Add(time.Microsecond)})
	if err != nil || later.Events != 1500 {
		t.Fatalf("PlanRepublish since the first half was published = %+v, %v; want the 1500 later events", later, err)
	}

	var calls int
	res, err := outbox.Republish(ctx, d.DB, k, outbox.RepublishConfig{Topic: topic, Since: since, BatchSize: 700}, func(outbox.RepublishResult) { calls++ })
	if err != nil {
		t.Fatalf("Republish: %v (after %+v)", err, res)
	}
	if res.Events != int64(len(evs)) || res.Batches != 5 || calls != 5 {
		t.Fatalf("Republish = %+v with %d progress calls, want %d events in 5 transactions", res, calls, len(evs))
	}
	after := readAll(t, k, topic)
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	assertExactlyOnce(t, after, ids)
	orig := map[string]kafkax.Record{}
	for _, r := range before {
		orig[r.Headers[outbox.HeaderEventID]] = r
	}
	last := map[string]int{}
	for _, r := range after {
		o := orig[r.Headers[outbox.HeaderEventID]]
		if r.Key != o.Key || !bytes.Equal(r.Value, o.Value) || r.Partition != o.Partition || r.Headers["tenant"] != "acme" ||
			r.Headers[outbox.HeaderEventType] != "Republished" {
			t.Fatalf("republished %v differs from the original %v", r, o)
		}
		var p seqPayload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatal(err)
		}
		if p.Seq != last[p.Key]+1 {
			t.Fatalf("key %s: event %d after %d: the key's order broke", p.Key, p.Seq, last[p.Key])
		}
		last[p.Key] = p.Seq
	}
	if n := len(readAll(t, k, other)); n != 1000 {
		t.Errorf("%d records on the other topic, want its 1000 published once", n)
	}
	// Bounded by bytes too: the later half again, in transactions of at most 2 KiB of events
	// (each about 150 bytes as read) besides the one that reaches it, every event once more.
	res, err = outbox.Republish(ctx, d.DB, k, outbox.RepublishConfig{Topic: topic, Since: mid.Add(time.Microsecond), BatchBytes: 2048}, nil)
	if err != nil || res.Events != 1500 || res.Batches < 1500*150/(2048+150) {
		t.Fatalf("Republish by 2 KiB = %+v, %v; want the 1500 later events in transactions of at most about 14", res, err)
	}
	if n := len(readAll(t, k, topic)); n != len(evs)+1500 {
		t.Fatalf("%d records on %s after republishing the later half again, want %d", n, topic, len(evs)+1500)
	}
	if _, err := outbox.Republish(ctx, d.DB, k, outbox.RepublishConfig{Topic: uniqueName("no-such-topic"), Since: since}, nil); !errors.Is(err, kafkax.ErrMissingTopic) ||
		!strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Republish to a missing topic: %v, want ErrMissingTopic", err)
	}
}

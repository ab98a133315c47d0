package outbox_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/outbox"
)

// Every record of an exactly-once batch is its own row's, byte for byte: rows with
// different keys, payloads (binary too), extra headers and trace parents, published two
// batches of many rows, read back with their key, value and headers exactly, on the
// partition of their key, in id order per key. The messages of a batch share its
// buffers: a row reading or sending another's bytes shows here.
func TestEOSRelayRecordsAreTheirRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const partitions, perBatch = 6, 300
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-eos-records", partitions)
	relay := newEOSRelay(t, d.DB, k, eosConfig(t, k, outbox.RelayConfig{}))
	w := newWriter(t)

	want := map[string]outbox.Event{}
	var order []string
	for b := range 2 {
		var evs []outbox.Event
		for i := range perBatch {
			n := b*perBatch + i
			e := outbox.Event{ID: fmt.Sprintf("rec-%d", n), Type: fmt.Sprintf("Type%d", n%3), Topic: topic,
				Key:     fmt.Sprintf("key-%d", n%17),
				Payload: append([]byte(strings.Repeat(fmt.Sprintf("p%d,", n), n%9+1)), 0xff, 0x00, byte(n))}
			if n%2 == 0 {
				e.Headers = map[string]string{"tenant": fmt.Sprintf("t-%d", n), "é": strings.Repeat("v", n%5)}
			}
			if n%3 == 0 {
				e.TraceParent = fmt.Sprintf("00-%032x-%016x-01", n+1, n+1)
			}
			if n%6 == 0 {
				e.Headers[tracex.Header] = "00-replaced" // the row's trace parent takes its place
			}
			evs = append(evs, e)
			want[e.ID] = e
			order = append(order, e.ID)
		}
		addCommitted(t, ctx, d.DB, w, evs...)
		if n, err := relay.RelayOnce(ctx); err != nil || n != perBatch {
			t.Fatalf("batch %d: RelayOnce %d, %v; want %d events in one batch", b, n, err, perBatch)
		}
	}

	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, order)
	hash := sarama.NewHashPartitioner(topic)
	last := map[string]int{} // key → index in order of its last record
	index := map[string]int{}
	for i, id := range order {
		index[id] = i
	}
	for _, r := range recs {
		id := r.Headers[outbox.HeaderEventID]
		e := want[id]
		if r.Key != e.Key || string(r.Value) != string(e.Payload) {
			t.Fatalf("record of %s: key %q value %q, want %q %q", id, r.Key, r.Value, e.Key, e.Payload)
		}
		hs := map[string]string{outbox.HeaderEventID: e.ID, outbox.HeaderEventType: e.Type}
		maps.Copy(hs, e.Headers)
		if e.TraceParent != "" {
			hs[tracex.Header] = e.TraceParent
		}
		if !maps.Equal(r.Headers, hs) {
			t.Fatalf("record of %s: headers %v, want %v", id, r.Headers, hs)
		}
		p, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(e.Key)}, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if r.Partition != p {
			t.Fatalf("record of %s (key %s) on partition %d, want %d", id, e.Key, r.Partition, p)
		}
		if prev, ok := last[e.Key]; ok && prev > index[id] {
			t.Fatalf("key %s: %s after %s", e.Key, id, order[prev])
		}
		last[e.Key] = index[id]
	}
}

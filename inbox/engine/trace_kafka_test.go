package engine_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// tracedOrder is one produced order and the trace its record carries. An untraced record
// carries none, and its delivery starts a trace of its own.
type tracedOrder struct {
	id     string
	parent trace.SpanContext // the record's traceparent; invalid when it has none
}

// produceTraced sends each order's record to topic with a traceparent header of a random,
// sampled trace. Every fifth order has no header.
func produceTraced(t *testing.T, kc kafkax.Config, topic string, value func(id string) []byte, n int, prefix string) []tracedOrder {
	t.Helper()
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var orders []tracedOrder
	var batch []*sarama.ProducerMessage
	for i := range n {
		o := tracedOrder{id: fmt.Sprintf("%s-%04d", prefix, i)}
		m := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(o.id), Value: sarama.ByteEncoder(value(o.id)),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}}
		if i%5 != 4 {
			var c trace.SpanContextConfig
			_, _ = rand.Read(c.TraceID[:])
			_, _ = rand.Read(c.SpanID[:])
			c.TraceFlags, c.Remote = trace.FlagsSampled, true
			o.parent = trace.NewSpanContext(c)
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(tracex.Header), Value: []byte(tracex.TraceParent(o.parent))})
		}
		orders = append(orders, o)
		batch = append(batch, m)
	}
	if err := p.SendMessages(batch); err != nil {
		t.Fatal(err)
	}
	return orders
}

// traceBreaks checks the published records against the orders. Each order's one record
// carries a traceparent, and an order produced with a trace carries that trace's id. It
// returns one line per problem.
func traceBreaks(recs []kafkax.Record, orders []tracedOrder) []string {
	byKey := map[string][]kafkax.Record{}
	for _, r := range recs {
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	var bad []string
	for _, o := range orders {
		rs := byKey[o.id]
		if len(rs) != 1 {
			bad = append(bad, fmt.Sprintf("order %s: %d records", o.id, len(rs)))
			continue
		}
		sc, ok := tracex.Parse(rs[0].Headers[tracex.Header])
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("order %s: no traceparent header (headers %v)", o.id, rs[0].Headers))
		case o.parent.IsValid() && sc.TraceID() != o.parent.TraceID():
			bad = append(bad, fmt.Sprintf("order %s: trace %s, want the record's %s", o.id, sc.TraceID(), o.parent.TraceID()))
		}
	}
	return bad
}

// plainEmitter is a plain handler, not a BatchHandler. Each delivery writes one event with
// outbox.Writer.Add, which a Batcher defers to its batch's multi-row insert.
type plainEmitter struct {
	out   *outbox.Writer
	topic string
}

func (h plainEmitter) Decode(m *message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{Key: string(m.Payload)}, nil
}

func (h plainEmitter) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	return inbox.Done, h.out.Add(ctx, tx, outbox.Event{ID: d.Key, Type: "Traced", Topic: h.topic, Key: d.Key, Payload: []byte(d.Key)})
}

// headerDropper is a relay producer that sends records without their traceparent header,
// as a relay that does not propagate the trace would.
type headerDropper struct{ sarama.SyncProducer }

func (p headerDropper) SendMessages(msgs []*sarama.ProducerMessage) error {
	for _, m := range msgs {
		var hs []sarama.RecordHeader
		for _, h := range m.Headers {
			if string(h.Key) != tracex.Header {
				hs = append(hs, h)
			}
		}
		m.Headers = hs
	}
	return p.SyncProducer.SendMessages(msgs)
}

// traceRun is one pipeline run of TestKafkaTraceCrossesTheOutbox. Orders go in with their
// traces, through the inbox and the relay, and are read back from the events' topic.
type traceRun struct {
	orders []tracedOrder
	recs   []kafkax.Record
	spans  tracetest.SpanStubs
	db     *sql.DB
}

// runTraced runs mode's path on the real broker and database. An SDK tracer provider
// records the inbox's and the relay's spans into memory.
//
//   - "batch" is the router's default. It runs the parallel subscriber, group commit, the
//     coupon granter's HandleBatch and the exactly-once relay.
//   - "grouped" is group commit of a plain handler, whose events are deferred to one
//     multi-row insert, with the exactly-once relay.
//   - "single" is the one-at-a-time subscriber and Inbox.Process, with the at-least-once
//     relay. The coupon grant runs three steps there, one transaction each. wrap may
//     change the relay's producer.
func runTraced(t *testing.T, mode string, wrap func(sarama.SyncProducer) outbox.Producer) traceRun {
	kc := testenv.Kafka(t)
	in := testenv.Topic(t, kc, "trace-in", 3)
	out := testenv.Topic(t, kc, "trace-out", 3)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	icfg := engine.Config{TracerProvider: tp}
	var ib *engine.Inbox
	var db *sql.DB
	value := func(id string) []byte { return []byte(orderJSON(id, "u")) }
	if mode == "grouped" {
		d := testenv.DB(t, 16)
		w, err := outbox.NewWriter("")
		if err != nil {
			t.Fatal(err)
		}
		icfg.BizType = "traced"
		if ib, err = engine.New(d.DB, plainEmitter{out: w, topic: out}, icfg, watermill.NopLogger{}, nil); err != nil {
			t.Fatal(err)
		}
		db, value = d.DB, func(id string) []byte { return []byte(id) }
	} else {
		p := newPipeline(t, pipelineOpts{conns: 16, grantedTopic: out, inboxCfg: icfg})
		ib, db = p.inbox, p.db.DB
	}

	rcfg := outbox.RelayConfig{PollInterval: 20 * time.Millisecond, TracerProvider: tp}
	var relay *outbox.Relay
	var err error
	if mode == "single" {
		producer, perr := kc.NewSyncProducer()
		if perr != nil {
			t.Fatal(perr)
		}
		t.Cleanup(func() { _ = producer.Close() })
		var p outbox.Producer = producer
		if wrap != nil {
			p = wrap(producer)
		}
		relay, err = outbox.NewRelay(db, p, rcfg, nil)
	} else {
		rcfg.TransactionalID, rcfg.PositionsTopic = "test-"+in, testenv.Topic(t, kc, "relay-positions", 1)
		relay, err = outbox.NewExactlyOnceRelay(db, kc, rcfg, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(rctx) }()
	t.Cleanup(func() { rcancel(); <-relayDone; _ = relay.Close() })

	const n = 40
	orders := produceTraced(t, kc, in, value, n, mode)
	if mode == "single" {
		startRouter(t, kc, "g-"+in, in, ib)
	} else {
		var received atomic.Int64
		startBatchRouter(t, kc, "g-"+in, in, ib, &received)
	}
	waitFor(t, "every event published", 90*time.Second, func() (bool, string) {
		total := count(t, db, "SELECT COUNT(*) FROM outbox")
		pending := count(t, db, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL")
		return total == n && pending == 0, fmt.Sprintf("events=%d unpublished=%d", total, pending)
	})
	if got := count(t, db, "SELECT COUNT(*) FROM outbox WHERE trace_parent IS NOT NULL"); got != n {
		t.Errorf("%d outbox rows with a trace_parent, want all %d: the writer stores the handler's trace", got, n)
	}
	recs, err := kc.ReadAll(context.Background(), out, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return traceRun{orders: orders, recs: recs, spans: exp.GetSpans(), db: db}
}

// TestKafkaTraceCrossesTheOutbox checks one trace from the incoming record to the
// published event, on the router's paths. Every event read back from Kafka carries a
// traceparent of its order's incoming trace. The delivery's consumer span is the incoming
// span's child. The relay's send span is in the same trace, and is the span the header
// names. So a consumer of the event continues after the send. A record without a
// traceparent starts a trace of its own, which its event carries on.
func TestKafkaTraceCrossesTheOutbox(t *testing.T) {
	for _, mode := range []string{"batch", "grouped", "single"} {
		t.Run(mode, func(t *testing.T) {
			r := runTraced(t, mode, nil)
			if bad := traceBreaks(r.recs, r.orders); len(bad) > 0 {
				t.Fatalf("%d problems, first: %v", len(bad), bad[:min(5, len(bad))])
			}
			byID := map[trace.SpanID]tracetest.SpanStub{}
			for _, s := range r.spans {
				byID[s.SpanContext.SpanID()] = s
			}
			recByKey := map[string]kafkax.Record{}
			for _, rec := range r.recs {
				recByKey[rec.Key] = rec
			}
			for _, o := range r.orders {
				header, _ := tracex.Parse(recByKey[o.id].Headers[tracex.Header])
				send, ok := byID[header.SpanID()]
				if !ok || send.SpanKind != trace.SpanKindProducer || send.SpanContext.TraceID() != header.TraceID() {
					t.Fatalf("order %s: the header's span %s is not a recorded send span of its trace (%+v)", o.id, header.SpanID(), send.Name)
				}
				// The send span's parent is the span that wrote the event. Up that chain is
				// the delivery's consumer span, whose parent is the record's remote span.
				var process tracetest.SpanStub
				for s, found := send, true; found; s, found = byID[s.Parent.SpanID()] {
					if s.SpanKind == trace.SpanKindConsumer {
						process = s
						break
					}
				}
				if process.SpanKind != trace.SpanKindConsumer {
					t.Fatalf("order %s: no consumer span above the send span %q", o.id, send.Name)
				}
				if o.parent.IsValid() && (process.Parent.SpanID() != o.parent.SpanID() || !process.Parent.IsRemote()) {
					t.Errorf("order %s: the delivery's span's parent is %s, want the record's span %s", o.id, process.Parent.SpanID(), o.parent.SpanID())
				}
			}
			names := map[string]int{}
			for _, s := range r.spans {
				names[s.Name]++
			}
			want := []string{"inbox claim", "inbox handle", "inbox commit"}
			if mode == "single" {
				want = append(want, "inbox transaction")
			} else {
				want = append(want, "inbox batch")
			}
			for _, n := range want {
				if names[n] == 0 {
					t.Errorf("no %q span recorded (spans %v)", n, names)
				}
			}
			if mode != "single" {
				linked := 0
				for _, s := range r.spans {
					if s.Name == "inbox batch" {
						linked += len(s.Links)
					}
				}
				if linked < len(r.orders) {
					t.Errorf("batch spans link %d deliveries, want every one of %d", linked, len(r.orders))
				}
			}
			t.Logf("%d spans: %v", len(r.spans), names)
		})
	}
}

// TestKafkaTraceBreaksWithoutTheHeader shows that the check above can fail. With a relay
// whose producer drops the traceparent header, the trace stops at the outbox, whose rows
// still hold it. traceBreaks then reports every event.
func TestKafkaTraceBreaksWithoutTheHeader(t *testing.T) {
	r := runTraced(t, "single", func(p sarama.SyncProducer) outbox.Producer { return headerDropper{p} })
	bad := traceBreaks(r.recs, r.orders)
	if len(bad) != len(r.orders) {
		t.Fatalf("%d problems for %d events sent without the header, want one each: %v", len(bad), len(r.orders), bad)
	}
	t.Logf("as expected, %d broken traces, first: %s", len(bad), bad[0])
}

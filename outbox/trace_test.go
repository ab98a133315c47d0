package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// spanContext is a sampled span context of trace t, span s.
func spanContext(t, s byte) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xab, t}, SpanID: trace.SpanID{0xcd, s}, TraceFlags: trace.FlagsSampled})
}

// TestRelayWritesTraceParent follows an event's trace parent through the outbox.
//   - The writer stores the event's own trace parent, else its context's span, else NULL.
//     It does so in Add, AddBatch and a group commit's deferred rows alike. It refuses a
//     trace parent that is not a traceparent.
//   - An untraced relay writes the stored value as the record's traceparent header, in
//     place of an extra header of that name. It writes nothing for an untraced event.
//   - A parked event keeps its trace parent and publishes it when retried.
//   - A traced relay writes its send span instead, a child of the stored context, recorded
//     with the event's id.
func TestRelayWritesTraceParent(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "trace-relay", 1)
	missing := uniqueName("trace-missing")
	db := d.DB
	w := newWriter(t)
	bg := context.Background()
	a, b := spanContext(1, 1), spanContext(2, 2)
	ctxA := trace.ContextWithSpanContext(bg, a)
	tpA, tpB := tracex.TraceParent(a), tracex.TraceParent(b)

	want := map[string]string{} // event id → traceparent header ("" none)
	ev := func(id, tp string, headers map[string]string) outbox.Event {
		return outbox.Event{ID: id, Type: "T", Topic: topic, Key: id, Payload: []byte(id), TraceParent: tp, Headers: headers}
	}
	addCommitted(t, ctxA, db, w, ev("from-ctx", "", nil), ev("own", tpB, nil), ev("replaced", "", map[string]string{tracex.Header: "junk", "x": "1"}))
	addCommitted(t, bg, db, w, ev("untraced", "", nil), ev("own-header", "", map[string]string{tracex.Header: tpB}))
	if err := dbx.InTx(bg, db, func(tx *sql.Tx) error {
		return w.AddBatch(ctxA, tx, []outbox.Event{ev("batch-ctx", "", nil), ev("batch-own", tpB, nil)})
	}); err != nil {
		t.Fatal(err)
	}
	addCommitted(t, ctxA, db, w, outbox.Event{ID: "parked", Type: "T", Topic: missing, Key: "parked", Payload: []byte("p")})
	for id, tp := range map[string]string{"from-ctx": tpA, "own": tpB, "replaced": tpA, "untraced": "", "own-header": tpB, "batch-ctx": tpA, "batch-own": tpB} {
		want[id] = tp
	}
	err := dbx.InTx(bg, db, func(tx *sql.Tx) error { return w.Add(bg, tx, ev("bad", "00-not-a-trace", nil)) })
	if err == nil {
		t.Fatal("an event with a malformed trace parent was stored")
	}
	var nulls int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox WHERE trace_parent IS NULL").Scan(&nulls); err != nil || nulls != 2 {
		t.Fatalf("%d rows without a trace parent (%v), want the two untraced", nulls, err)
	}

	// An untraced relay writes the stored value as it is. The event of the missing topic is
	// parked.
	client, p := clientProducer(t, k)
	relay := newRelay(t, db, p, outbox.RelayConfig{PollInterval: 5 * time.Millisecond}).CheckWith(client, client.Config().Producer.MaxMessageBytes)
	if _, err := relay.RelayOnce(bg); err != nil {
		t.Fatal(err)
	}
	var parkedTrace sql.NullString
	if err := db.QueryRow("SELECT trace_parent FROM outbox_parked WHERE event_id = 'parked'").Scan(&parkedTrace); err != nil || parkedTrace.String != tpA {
		t.Fatalf("parked row's trace parent %v (%v), want %s", parkedTrace, err, tpA)
	}
	createTopic(t, k, missing, 1, nil)
	parked, err := outbox.NewParked(db, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parked.Retry(bg, "parked"); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.RelayOnce(bg); err != nil {
		t.Fatal(err)
	}
	recs, err := k.ReadAll(bg, topic, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	back, err := k.ReadAll(bg, missing, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want["parked"] = tpA
	if got := len(recs) + len(back); got != len(want) {
		t.Fatalf("%d records, want %d", got, len(want))
	}
	for _, r := range append(recs, back...) {
		if got := r.Headers[tracex.Header]; got != want[r.Key] {
			t.Errorf("event %s: traceparent header %q, want %q", r.Key, got, want[r.Key])
		}
	}

	// With a traced relay, the header names its send span, a child of the stored context.
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(bg) }()
	addCommitted(t, ctxA, db, w, ev("traced", "", nil))
	eos := newEOSRelay(t, db, k, eosConfig(t, k, outbox.RelayConfig{TracerProvider: tp}))
	if n, err := eos.RelayOnce(bg); err != nil || n != 1 {
		t.Fatalf("relay: %d %v, want the one traced event", n, err)
	}
	recs, err = k.ReadAll(bg, topic, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var header trace.SpanContext
	for _, r := range recs {
		if r.Key == "traced" {
			header, _ = tracex.Parse(r.Headers[tracex.Header])
		}
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans recorded, want one send span", len(spans))
	}
	s := spans[0]
	switch {
	case s.Name != "send "+topic || s.SpanKind != trace.SpanKindProducer:
		t.Errorf("span %q kind %v, want a producer span named send %s", s.Name, s.SpanKind, topic)
	case s.Parent.SpanID() != a.SpanID() || s.SpanContext.TraceID() != a.TraceID():
		t.Errorf("send span's parent %s of trace %s, want the stored %s of %s", s.Parent.SpanID(), s.SpanContext.TraceID(), a.SpanID(), a.TraceID())
	case header.SpanID() != s.SpanContext.SpanID() || header.TraceID() != a.TraceID():
		t.Errorf("the record's traceparent names span %s of trace %s, want the send span %s", header.SpanID(), header.TraceID(), s.SpanContext.SpanID())
	}
	ids := map[string]bool{}
	for _, at := range s.Attributes {
		ids[string(at.Key)+"="+at.Value.Emit()] = true
	}
	if !ids["messaging.message.id=traced"] || !ids["messaging.destination.name="+topic] {
		t.Errorf("send span attributes %v lack the event id or the topic", s.Attributes)
	}
}

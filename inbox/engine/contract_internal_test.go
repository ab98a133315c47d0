package engine

import (
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/tracex"
)

// What crosses between the contract and the engine, through internal/inboxhook: the span
// context the engine gives a delivery reaches Delivery.TraceParent, and the reply a handler
// states with Delivery.Respond reaches the engine.
func TestHooksCrossTheContract(t *testing.T) {
	d := &inbox.Delivery{Key: "k"}
	if d.TraceParent() != "" || replyOf(d) != nil {
		t.Fatalf("a new delivery has traceparent %q, reply %v", d.TraceParent(), replyOf(d))
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
	})
	setTrace(d, sc)
	if got, want := d.TraceParent(), tracex.TraceParent(sc); got != want || got == "" {
		t.Errorf("TraceParent %q, want %q", got, want)
	}
	if err := d.Respond(201, map[string]string{"id": "c-1"}); err != nil {
		t.Fatal(err)
	}
	if r := replyOf(d); r == nil || r.Status != 201 || string(r.Body) != `{"id":"c-1"}` {
		t.Errorf("reply %+v, want 201 {\"id\":\"c-1\"}", r)
	}
}

package tracex_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracex"
)

// TraceParent writes what the W3C propagator writes, Parse reads it back, and both refuse
// what is not a trace: an invalid span context, malformed or all-zero values.
func TestTraceParent(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	const want = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	got := tracex.TraceParent(sc)
	if got != want || len(got) != tracex.Len {
		t.Fatalf("TraceParent = %q, want %q", got, want)
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	if carrier[tracex.Header] != got {
		t.Fatalf("the W3C propagator writes %q, TraceParent %q", carrier[tracex.Header], got)
	}
	back, ok := tracex.Parse(got)
	if !ok || back.TraceID() != sc.TraceID() || back.SpanID() != sc.SpanID() || !back.IsSampled() || !back.IsRemote() {
		t.Fatalf("Parse(%q) = %v %v", got, back, ok)
	}
	if tracex.TraceParent(trace.SpanContext{}) != "" {
		t.Error("an invalid span context has a traceparent")
	}
	for _, bad := range []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "not a trace"} {
		if _, ok := tracex.Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	ctx := tracex.Extract(context.Background(), map[string]string{tracex.Header: want, "other": "x"})
	if trace.SpanContextFromContext(ctx).TraceID() != sc.TraceID() {
		t.Error("Extract did not read the header")
	}
	if ctx := tracex.Extract(context.Background(), map[string]string{"other": "x"}); trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("Extract found a trace in headers without one")
	}
	if tracex.Tracer(nil, "x") != nil {
		t.Error("a nil provider gives a tracer: tracing would not be off")
	}
	tracex.End(nil, nil) // a nil span (tracing off) is ended without a panic
}

// parseByPropagator is what OpenTelemetry's W3C propagator makes of a traceparent value.
func parseByPropagator(s string) (trace.SpanContext, bool) {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{tracex.Header: s})
	sc := trace.SpanContextFromContext(ctx)
	return sc, sc.IsValid()
}

// Parse judges every traceparent value as the W3C propagator does (the header comes from
// outside: any bytes), and TraceParent writes back a version 00 value of what it read.
func FuzzParseTraceParent(f *testing.F) {
	for _, s := range []string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-04",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-extra", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := tracex.Parse(s)
		want, wantOK := parseByPropagator(s)
		if ok != wantOK || (ok && (got.TraceID() != want.TraceID() || got.SpanID() != want.SpanID() || got.TraceFlags() != want.TraceFlags() || !got.IsRemote())) {
			t.Fatalf("Parse(%q) = %v %v, the propagator %v %v", s, got, ok, want, wantOK)
		}
		if ok {
			if back, _ := tracex.Parse(tracex.TraceParent(got)); !back.Equal(got) {
				t.Fatalf("%q: written back as %q, read as %v", s, tracex.TraceParent(got), back)
			}
		}
	})
}

// Package tracex carries W3C trace context, the traceparent header, through onceflow. The
// context goes from an incoming Kafka record's headers into the inbox's spans. It goes on
// into the trace_parent column of the outbox row a handler writes. It goes out again as the
// published record's traceparent header. Spans are OpenTelemetry's, from
// go.opentelemetry.io/otel/trace. onceflow traces only when it is given a TracerProvider,
// and creates no span otherwise.
package tracex

import (
	"context"
	"encoding/hex"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header is the W3C trace context header of a record, and its Watermill metadata key.
const Header = "traceparent"

// Len is the length of a version 00 traceparent, 00-<32 hex>-<16 hex>-<2 hex>.
const Len = 55

// TraceParent returns sc as a version 00 traceparent value, or "" when sc is not valid.
// It keeps only the flags the specification defines, sampled and random.
func TraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	var b [Len]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))})
	return string(b[:])
}

// Parse reads a traceparent value into a remote span context. ok is false when s is not a
// valid traceparent, as the W3C propagator go.opentelemetry.io/otel/propagation.TraceContext
// judges it. s may be empty, malformed, or have an all-zero id. Parse is that propagator's
// parse without its tracestate. It has a small stack frame and allocates nothing. The
// consumer calls it on a fresh goroutine for every message. The propagator's tracestate
// parsing would grow that goroutine's stack, and copy it, for every record.
func Parse(s string) (sc trace.SpanContext, ok bool) {
	// The form is version "-" trace-id "-" parent-id "-" flags, in lower-case hex. A
	// version above 00 may append fields after a "-".
	if len(s) < Len || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return sc, false
	}
	version, ok1 := hexByte(s[0], s[1])
	flags, ok2 := hexByte(s[53], s[54])
	switch {
	case !ok1 || !ok2 || version == 0xff:
		return sc, false
	case version == 0 && (flags > 3 || len(s) > Len+1 || len(s) == Len+1 && s[Len] != '-'):
		return sc, false // (the propagator lets a version 00 value end in one "-")
	case version > 0 && len(s) > Len && s[Len] != '-':
		return sc, false
	}
	var c trace.SpanContextConfig
	for i := range c.TraceID {
		if c.TraceID[i], ok = hexByte(s[3+2*i], s[4+2*i]); !ok {
			return sc, false
		}
	}
	for i := range c.SpanID {
		if c.SpanID[i], ok = hexByte(s[36+2*i], s[37+2*i]); !ok {
			return sc, false
		}
	}
	c.TraceFlags = trace.TraceFlags(flags) & (trace.FlagsSampled | trace.FlagsRandom)
	c.Remote = true
	sc = trace.NewSpanContext(c)
	return sc, sc.IsValid()
}

// hexByte decodes two lower-case hex digits.
func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexDigit(hi)
	l, ok2 := hexDigit(lo)
	return h<<4 | l, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// Extract returns ctx with the remote span context of the traceparent in headers, with the
// tracestate when there is one. headers are a record's headers as Watermill metadata.
// Extract returns ctx itself when there is no traceparent or it is malformed.
func Extract(ctx context.Context, headers map[string]string) context.Context {
	sc, ok := Parse(headers[Header])
	if !ok {
		return ctx
	}
	if ts := headers["tracestate"]; ts != "" {
		return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(headers))
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Tracer returns tp's tracer of the named instrumentation scope, or nil when tp is nil.
// Callers trace only with a non-nil tracer, so nothing is created when tracing is off.
func Tracer(tp trace.TracerProvider, scope string) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(scope)
}

// End ends span and records err as its status. It does nothing for a nil span.
func End(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

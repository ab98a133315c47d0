package outbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracex"
)

// tracerScope names the relay's spans' instrumentation scope.
const tracerScope = "github.com/onceflow/onceflow/outbox"

// startPublish starts one send span per row of batch that has a trace parent. Each span is
// a child of the row's stored context. startPublish writes the span's context into the
// record's traceparent header, so the downstream consumer's span follows the send. When the
// relay does not trace, it starts nothing and returns nil. endPublish ends the spans.
func (r *relayBase) startPublish(ctx context.Context, batch []outRow, shard string) []trace.Span {
	if r.tr == nil {
		return nil
	}
	var spans []trace.Span
	for _, o := range batch {
		if !o.trace.Valid {
			continue
		}
		parent, ok := tracex.Parse(o.trace.String)
		if !ok || o.msg == nil {
			continue
		}
		_, span := r.tr.Start(trace.ContextWithRemoteSpanContext(ctx, parent), "send "+o.topic, trace.WithSpanKind(trace.SpanKindProducer))
		if span.IsRecording() { // attributes only for a recorded span, whose trace is sampled
			span.SetAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", o.topic),
				attribute.String("messaging.message.id", o.eventID),
				attribute.Int("messaging.batch.message_count", len(batch)),
				attribute.Int64("onceflow.outbox.id", o.id))
			if shard != "" {
				span.SetAttributes(attribute.String("onceflow.relay.shard", shard))
			}
		}
		if tp := tracex.TraceParent(span.SpanContext()); tp != "" {
			for i, h := range o.msg.Headers {
				if string(h.Key) == tracex.Header {
					o.msg.Headers[i].Value = []byte(tp)
				}
			}
		}
		spans = append(spans, span)
	}
	return spans
}

// endPublish ends the spans of startPublish with the batch's err as their status.
func endPublish(spans []trace.Span, err error) {
	for _, s := range spans {
		tracex.End(s, err)
	}
}

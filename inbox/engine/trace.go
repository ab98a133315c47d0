package engine

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/tracex"
)

// Tracing is on when Config.TracerProvider is set. Every delivery gets a consumer span,
// "process <topic>". It continues the trace of the record's traceparent header, or of the
// span ctx already carries. It ends with the delivery's outcome.
//
// One at a time, a delivery's span holds "inbox prepare", outside the transaction. It
// holds "inbox transaction" per transaction, with "inbox claim", one "inbox handle" per
// handler step and "inbox commit".
//
// A group-committed batch is one transaction for many traces. It has a span of its own,
// "inbox batch", in a new trace. The batch's span links to each delivery's span, and each
// delivery's span links back to it. The batch's span holds "inbox claim", "inbox handle"
// for HandleBatch and "inbox commit". A plain handler's deliveries each get their "inbox
// handle" in their own trace.
//
// The handler's ctx carries its "inbox handle" span. So outbox.Writer.Add stores that
// span's context with the event, in trace_parent, and the relay continues the trace.
// Delivery.TraceParent gives an inbox.BatchHandler each delivery's span.
//
// Without a TracerProvider nothing here runs. Process, Batcher.Process and each step find
// ib.tr nil, and create no span, context or attribute.

// tracerScope names the inbox's spans' instrumentation scope.
const tracerScope = "github.com/onceflow/onceflow/inbox"

// tracedKey marks a ctx carrying the span of the delivery of the *message.Message it holds.
// Batcher.Process started the span. So Process, running that delivery one at a time after
// all, starts no second one.
type tracedKey struct{}

// processTraced is Process under a delivery span.
func (ib *Inbox) processTraced(ctx context.Context, msg *message.Message, src inbox.Source, opts runOpts) (Result, error) {
	ctx, span := ib.startDelivery(ctx, msg, src)
	res, err := ib.run(ctx, msg, src, opts)
	endDelivery(span, res, err)
	return res, err
}

// processTraced is Batcher.processWaiting under a delivery span.
func (b *Batcher) processTraced(ctx context.Context, msg *message.Message, src inbox.Source, wait time.Duration) (Result, error) {
	ctx, span := b.ib.startDelivery(ctx, msg, src)
	res, err := b.process(ctx, msg, src, span, wait)
	endDelivery(span, res, err)
	return res, err
}

// startDelivery starts the delivery's consumer span. The span is a child of the span ctx
// carries, else of the record's traceparent header, else it starts a new trace.
func (ib *Inbox) startDelivery(ctx context.Context, msg *message.Message, src inbox.Source) (context.Context, trace.Span) {
	parent := ctx
	if !trace.SpanContextFromContext(ctx).IsValid() {
		parent = tracex.Extract(ctx, msg.Metadata)
	}
	name := "process"
	if src.Topic != "" {
		name += " " + src.Topic
	}
	ctx, span := ib.tr.Start(parent, name, trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() { // attributes only for a span that is recorded (sampled)
		span.SetAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", src.Topic),
			attribute.String("messaging.destination.partition.id", strconv.Itoa(int(src.Partition))),
			attribute.Int64("messaging.kafka.offset", src.Offset),
			attribute.String("messaging.message.id", msg.UUID),
			attribute.String("onceflow.biz_type", ib.cfg.BizType))
	}
	return context.WithValue(ctx, tracedKey{}, msg), span
}

// endDelivery ends a delivery span with the delivery's outcome. An error, which leaves the
// message unacked, a quarantine or a conflict sets its status to Error.
func endDelivery(span trace.Span, res Result, err error) {
	if err == nil && span.IsRecording() {
		attrs := []attribute.KeyValue{attribute.String("onceflow.outcome", string(res.Outcome)), attribute.String("onceflow.key", res.Key),
			attribute.Int64("onceflow.inbox_id", res.InboxID), attribute.Int("onceflow.attempts", res.Attempts), {}}
		if res.Reason != "" {
			attrs[len(attrs)-1] = attribute.String("onceflow.reason", string(res.Reason))
		} else {
			attrs = attrs[:len(attrs)-1]
		}
		span.SetAttributes(attrs...)
		if res.Outcome == OutcomeQuarantined || res.Outcome == OutcomeConflict {
			span.SetStatus(codes.Error, string(res.Outcome)+": "+string(res.Reason))
		}
	}
	tracex.End(span, err)
}

// startSpan starts a span named name under ctx's. It returns ctx and a nil span when the
// inbox does not trace, and tracex.End takes the nil span.
func (ib *Inbox) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if ib.tr == nil {
		return ctx, nil
	}
	return ib.tr.Start(ctx, name)
}

// startBatch starts a batch transaction's span. It is a new trace linked to every
// delivery's span, and each delivery's span links back to it. startBatch returns ctx and
// nil when the inbox does not trace.
func (b *Batcher) startBatch(ctx context.Context, items []*item) (context.Context, trace.Span) {
	if b.ib.tr == nil {
		return ctx, nil
	}
	links := make([]trace.Link, 0, len(items))
	for _, it := range items {
		if it.p.span != nil {
			links = append(links, trace.Link{SpanContext: it.p.span.SpanContext()})
		}
	}
	ctx, span := b.ib.tr.Start(ctx, "inbox batch", trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("onceflow.biz_type", b.ib.cfg.BizType), attribute.Int("onceflow.batch.deliveries", len(items))))
	self := trace.Link{SpanContext: span.SpanContext()}
	for _, it := range items {
		if it.p.span != nil {
			it.p.span.AddLink(self)
			setTrace(it.d, it.p.span.SpanContext())
		}
	}
	return ctx, span
}

// startHandleOne starts the "inbox handle" span of one delivery of a plain handler's
// batch. The span is in the delivery's trace, and links to the batch's span, which is
// ctx's. startHandleOne returns ctx and nil when the inbox does not trace.
func (b *Batcher) startHandleOne(ctx context.Context, it *item) (context.Context, trace.Span) {
	if b.ib.tr == nil || it.p.span == nil {
		return ctx, nil
	}
	return b.ib.tr.Start(trace.ContextWithSpan(ctx, it.p.span), "inbox handle",
		trace.WithLinks(trace.LinkFromContext(ctx)), trace.WithAttributes(attribute.Int("onceflow.step", it.d.Step)))
}

// handleStep runs one Handle call under its "inbox handle" span, which the handler's ctx
// carries. outbox.Writer.Add stores the span with the events.
func (ib *Inbox) handleStep(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if ib.tr == nil {
		return ib.h.Handle(ctx, tx, d)
	}
	ctx, span := ib.tr.Start(ctx, "inbox handle", trace.WithAttributes(attribute.Int("onceflow.step", d.Step)))
	returned := false
	defer func() {
		if !returned { // a panic, recovered by guard: the span still ends
			span.SetStatus(codes.Error, "the handler panicked")
			span.End()
		}
	}()
	prog, err := ib.h.Handle(ctx, tx, d)
	returned = true
	tracex.End(span, err)
	return prog, err
}

// committing returns fn for dbx.InTx and the function to call with InTx's error. When the
// inbox traces, an "inbox commit" span starts once fn has succeeded, since InTx commits
// next. The span ends with the commit's outcome.
func (ib *Inbox) committing(ctx context.Context, fn func(*sql.Tx) error) (func(*sql.Tx) error, func(error)) {
	if ib.tr == nil {
		return fn, endNothing
	}
	var span trace.Span
	return func(tx *sql.Tx) error {
			span = nil
			err := fn(tx)
			if err == nil {
				_, span = ib.tr.Start(ctx, "inbox commit")
			}
			return err
		}, func(err error) {
			tracex.End(span, err)
		}
}

func endNothing(error) {}

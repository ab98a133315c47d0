package inbox

import (
	"fmt"

	"go.opentelemetry.io/otel/trace"
)

// The engine's side of the contract: what it reads of a Delivery that plugin code set, what
// it sets on one for plugin code to read, and what it keeps beside a Decoded.

// decoded is a handler's Decoded with what the engine adds after Decode.
type decoded struct {
	Decoded
	meta string // the message's metadata as stored
}

// validProgress reports whether p is Done or Continue.
func validProgress(p Progress) bool { return p == Done || p == Continue }

// invalidProgress is the error of a Handle call that returned p.
func invalidProgress(p Progress) error {
	return fmt.Errorf("%w: %s", ErrInvalidProgress, p)
}

// replyOf is the response Delivery.Respond stated on d, or nil when it stated none.
func replyOf(d *Delivery) *Reply {
	if d.reply == nil {
		return nil
	}
	return &Reply{Status: d.reply.status, Body: d.reply.body}
}

// setTrace sets the span context of d's delivery, which Delivery.TraceParent reads.
func setTrace(d *Delivery, sc trace.SpanContext) { d.trace = sc }

package engine

import (
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/inboxhook"
)

// The engine's side of the contract: what it reads of a Delivery that plugin code set, what
// it sets on one for plugin code to read, and what it keeps beside a Decoded.

// decoded is a handler's Decoded with what the engine adds after Decode.
type decoded struct {
	inbox.Decoded
	meta string // the message's metadata as stored
}

// validProgress reports whether p is Done or Continue.
func validProgress(p inbox.Progress) bool { return p == inbox.Done || p == inbox.Continue }

// invalidProgress is the error of a Handle call that returned p.
func invalidProgress(p inbox.Progress) error {
	return fmt.Errorf("%w: %s", inbox.ErrInvalidProgress, p)
}

// hooks reach what package inbox keeps unexported in a Delivery. Package inbox installs
// them in its init function, which runs before this package is initialised.
var hooks = inboxhook.Get[inbox.Delivery]()

// replyOf is the response Delivery.Respond stated on d, or nil when it stated none.
func replyOf(d *inbox.Delivery) *Reply {
	status, body, ok := hooks.Reply(d)
	if !ok {
		return nil
	}
	return &Reply{Status: status, Body: body}
}

// setTrace sets the span context of d's delivery, which Delivery.TraceParent reads.
func setTrace(d *inbox.Delivery, sc trace.SpanContext) { hooks.SetTrace(d, sc) }

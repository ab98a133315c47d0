// Package inboxhook carries what crosses between package inbox, the plugin author's
// contract, and package inbox/engine, which runs it, without a setter in the contract's
// API: the response a handler states with Delivery.Respond, which the engine stores, and
// the span context the engine gives a delivery, which Delivery.TraceParent reads.
//
// Package inbox installs the hooks from its init function. The engine imports inbox, so
// inbox is initialised first, and the engine takes them when it is initialised. The
// standard library reaches across packages the same way, as os does with internal/poll.
package inboxhook

import (
	"fmt"

	"go.opentelemetry.io/otel/trace"
)

// Delivery are the hooks of D, the contract's Delivery.
type Delivery[D any] struct {
	// SetTrace sets the span context of d's delivery, which Delivery.TraceParent reads.
	SetTrace func(d *D, sc trace.SpanContext)
	// Reply returns the response Delivery.Respond stated on d, and false when it stated
	// none.
	Reply func(d *D) (status int, body []byte, ok bool)
}

// hooks holds the Delivery[D] that Set installed.
var hooks any

// Set installs the hooks of D. Package inbox calls it once, from its init function.
func Set[D any](h Delivery[D]) { hooks = h }

// Get returns the hooks of D that Set installed. It panics when there are none, which
// means the caller was initialised before package inbox.
func Get[D any]() Delivery[D] {
	h, ok := hooks.(Delivery[D])
	if !ok {
		panic(fmt.Sprintf("inboxhook: no hooks of %T installed", new(D)))
	}
	return h
}

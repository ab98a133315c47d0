package inbox

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/inboxhook"
)

// The engine, package inbox/engine, sets a delivery's trace and reads the reply its handler
// stated through internal/inboxhook, so the contract exports no setter for either.
func init() {
	inboxhook.Set(inboxhook.Delivery[Delivery]{
		SetTrace: func(d *Delivery, sc trace.SpanContext) { d.trace = sc },
		Reply: func(d *Delivery) (int, []byte, bool) {
			if d.reply == nil {
				return 0, nil, false
			}
			return d.reply.status, d.reply.body, true
		},
	})
}

package inbox

import (
	"time"

	"github.com/onceflow/onceflow/internal/registry"
)

// WhereOf is Filter.where, for the external tests that check a filter's query plan.
func WhereOf(f Filter, now time.Time) ([]string, []any) { return f.where(now) }

// RegisterIn registers p in r as MustRegister registers it for the binary, for the tests of
// the registration's checks (an isolated registry).
func RegisterIn(r *registry.Registry[Plugin], p Plugin) { registerIn(r, p) }

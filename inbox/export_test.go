package inbox

import "github.com/onceflow/onceflow/internal/registry"

// RegisterIn registers p in r as MustRegister registers it for the binary, for the tests of
// the registration's checks (an isolated registry).
func RegisterIn(r *registry.Registry[Plugin], p Plugin) { registerIn(r, p) }

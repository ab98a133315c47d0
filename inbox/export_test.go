package inbox

import "github.com/onceflow/onceflow/internal/registry"

// RegisterIn registers p in r as MustRegister registers it for the binary. The tests of
// the registration's checks use it with an isolated registry.
func RegisterIn(r *registry.Registry[Plugin], p Plugin) { registerIn(r, p) }

package onceflow

// SetConfigUnchecked changes rt's configuration after New checked it: for the tests of what
// a library refuses that the router's checks let through.
func SetConfigUnchecked(rt *Runtime, change func(*Config)) { change(&rt.s.Config) }

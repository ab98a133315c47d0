package outbox

// FaultHooks break the relay on purpose, in a build whose checker must show that it catches
// the violation (the chaos harness's broken router: scripts/chaos.sh CHAOS_BROKEN=reconcile,
// make chaos-broken). No hooks are installed unless such a build calls SetFaultHooks.
type FaultHooks interface {
	// SkipReconcile reports whether an exactly-once session skips its reconciliation at
	// start, so that a batch committed to Kafka but not marked is published again.
	SkipReconcile() bool
}

var faults FaultHooks

// SetFaultHooks installs h for every relay of the process (nil removes them). Call it from
// an init function, before any relay runs.
func SetFaultHooks(h FaultHooks) { faults = h }

// skipReconcile reports whether the installed fault hooks skip the reconciliation.
func skipReconcile() bool { return faults != nil && faults.SkipReconcile() }

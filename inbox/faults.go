package inbox

// FaultHooks break the inbox on purpose, in a build whose checker must show that it catches
// the violation (the chaos harness's broken router: scripts/chaos.sh CHAOS_BROKEN=inbox). No
// hooks are installed unless such a build calls SetFaultHooks.
type FaultHooks interface {
	// ClaimSQL returns the statement that claims a delivery's inbox row in Process, given
	// the correct one.
	ClaimSQL(q string) string
}

var faults FaultHooks

// SetFaultHooks installs h for every inbox of the process (nil removes them). Call it from
// an init function, before any delivery is processed.
func SetFaultHooks(h FaultHooks) { faults = h }

// claimStatement is the claim statement q as the installed fault hooks have it (q itself
// without hooks).
func claimStatement(q string) string {
	if faults == nil {
		return q
	}
	return faults.ClaimSQL(q)
}

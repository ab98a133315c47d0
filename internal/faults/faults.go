// Package faults breaks the inbox and the outbox relay on purpose, in a build whose checker
// must show that it catches the violation (the chaos harness's broken routers:
// tools/chaosrouter, scripts/chaos.sh CHAOS_BROKEN=inbox|reconcile, make chaos-broken). No
// hooks are installed unless such a build sets them, from an init function, before any
// delivery is processed or any relay runs.
package faults

// Inbox breaks the inbox.
type Inbox interface {
	// ClaimSQL returns the statement that claims a delivery's inbox row in Process, given
	// the correct one.
	ClaimSQL(q string) string
}

// Outbox breaks the relay.
type Outbox interface {
	// SkipReconcile reports whether an exactly-once session skips its reconciliation at
	// start, so that a batch committed to Kafka but not marked is published again.
	SkipReconcile() bool
}

var (
	inboxHooks  Inbox
	outboxHooks Outbox
)

// SetInbox installs h for every inbox of the process (nil removes them).
func SetInbox(h Inbox) { inboxHooks = h }

// SetOutbox installs h for every relay of the process (nil removes them).
func SetOutbox(h Outbox) { outboxHooks = h }

// ClaimStatement is the claim statement q as the installed hooks have it (q itself without
// hooks).
func ClaimStatement(q string) string {
	if inboxHooks == nil {
		return q
	}
	return inboxHooks.ClaimSQL(q)
}

// SkipReconcile reports whether the installed hooks skip the relay's reconciliation.
func SkipReconcile() bool { return outboxHooks != nil && outboxHooks.SkipReconcile() }

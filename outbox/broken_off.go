//go:build !onceflow_broken_reconcile

package outbox

// brokenSkipReconcile is true only in the deliberately broken build of the chaos harness
// (-tags onceflow_broken_reconcile, see broken_on.go).
const brokenSkipReconcile = false

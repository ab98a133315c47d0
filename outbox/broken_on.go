//go:build onceflow_broken_reconcile

package outbox

// A deliberately broken build, for the chaos harness only (scripts/chaos.sh
// CHAOS_BROKEN=reconcile, make chaos-broken): the exactly-once relay skips its reconciliation
// at session start, so a batch that was committed to Kafka but not marked (a crash between
// the two) is published again. The harness's checker must report the duplicate events.
const brokenSkipReconcile = true

// Package coupon grants one coupon per paid order: the worked example and first plugin of
// onceflow.
//
// The grant is a state machine (state.go: pure domain code, no SQL, no Kafka) whose steps
// each make an idempotent outside call and move the grant with an optimistic-lock
// transition (grant.go, repo.go), on sharded stock and budget counters. The plugin's
// handler (handler.go) is written on the contract a plugin author sees: inbox.Typed,
// inbox.Inserter, outbox.Writer and, for slow calls, inbox.Preparer. Its HandleBatch
// (batch.go) is the expert path of group commit, multi-row statements for a whole batch.
// plugin.go declares the plugin; claim.go is its HTTP command (POST /v1/claims).
package coupon

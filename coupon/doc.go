// Package coupon grants one coupon per paid order. It is the worked example and the first
// plugin of onceflow.
//
// The grant is a state machine of pure domain code, without SQL or Kafka, in state.go. Each
// step makes an idempotent outside call and moves the grant with an optimistic-lock
// transition, in grant.go and repo.go. The steps take from sharded stock and budget
// counters. The plugin's handler, in handler.go, is written on the contract a plugin author
// sees. It uses inbox.Typed, inbox.Inserter, outbox.Writer and, for slow calls,
// inbox.Preparer. Its HandleBatch, in batch.go, is the expert path of group commit. It
// writes a whole batch with multi-row statements. plugin.go declares the plugin, and
// claim.go holds its HTTP command, POST /v1/claims.
package coupon

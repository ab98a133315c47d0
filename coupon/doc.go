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
//
// What the package exports is what a reader of the worked example and an operator meet:
// the declaration (Plugin, PluginName, BizType, ConsumerGroup, OrderPaidTopic, Migrations),
// its settings (Config, DefaultConfig), the messages it reads and writes (OrderPaid,
// DecodeOrderPaid, ErrBadOrderPaid, MaxIDLen, GrantEvent, EventGranted, EventGrantFailed,
// and the claim command's ClaimPath, ClaimBizType, ClaimRequest, ClaimResponse with its
// State), and the ids of its rows (GrantID, ClaimID, CouponID, EventID).
//
// One group more is for onceflow's own tests and tools, which drive the grant without the
// runtime, and not for a plugin: Granter (NewGranter) with the ExternalService its steps
// call, EnsureCampaign, which creates a campaign's counters, and Verify, the audit of a
// campaign (Audit).
package coupon

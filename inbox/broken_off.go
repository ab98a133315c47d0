//go:build !onceflow_broken_inbox

package inbox

// brokenClaimSQL is the claim statement as is; only the deliberately broken build of the
// chaos harness (-tags onceflow_broken_inbox, see broken_on.go) changes it.
func brokenClaimSQL(q string) string { return q }

//go:build onceflow_broken_inbox

package inbox

import "strings"

// A deliberately broken build, for the chaos harness only (scripts/chaos.sh
// CHAOS_BROKEN=inbox): the inbox's claim never finds the existing row, as if it skipped its
// dedup insert: every delivery inserts a row of its own under a unique key, so redeliveries
// and duplicate messages run the handler again. The coupon state machine still holds (the
// grant's primary key and its compare-and-set transitions), so there are no duplicate
// coupons; the harness's checker must report the inbox ⇔ grant mismatches instead.
func brokenClaimSQL(q string) string {
	return strings.Replace(q, "VALUES (?,", "VALUES (LEFT(CONCAT(?, '#nodedup-', UUID()), 191),", 1)
}

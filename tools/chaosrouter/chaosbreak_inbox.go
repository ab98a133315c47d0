//go:build onceflow_broken_inbox

package main

// A deliberately broken router, for the chaos harness only (scripts/chaos.sh
// CHAOS_BROKEN=inbox): the inbox's claim never finds the existing row, as if it skipped its
// dedup insert: every delivery inserts a row of its own under a unique key, so redeliveries
// and duplicate messages run the handler again. The coupon state machine still holds (the
// grant's primary key and its compare-and-set transitions), so there are no duplicate
// coupons; the harness's checker must report the inbox ⇔ grant mismatches instead.

import (
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/internal/faults"
)

// noDedupClaim makes the claim's dedup key unique: the first value of its VALUES list.
type noDedupClaim struct{}

var _ faults.Inbox = noDedupClaim{}

const claimValues = "VALUES (?,"

func (noDedupClaim) ClaimSQL(q string) string {
	if !strings.Contains(q, claimValues) {
		// A claim of another shape would leave this build unbroken, and the harness
		// would wrongly conclude that its checker misses the break.
		panic(fmt.Sprintf("chaos break inbox: the claim statement has no %q: %s", claimValues, q))
	}
	return strings.Replace(q, claimValues, "VALUES (LEFT(CONCAT(?, '#nodedup-', UUID()), 191),", 1)
}

func init() { faults.SetInbox(noDedupClaim{}) }

package metrics

import (
	"fmt"
	"testing"
	"time"
)

// Rows waiting for a delayed redelivery are 'failed' in the table but not quarantined: they
// leave the failed counts (onceflow_inbox_rows{status="failed"}) for Delayed
// (onceflow_inbox_delayed_rows), with their earliest next attempt.
func TestSplitDelayed(t *testing.T) {
	next := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := DBStats{
		InboxRows:     []InboxCount{{"coupon", "done", 10}, {"coupon", "failed", 5}, {"other", "failed", 1}},
		FailedReasons: []ReasonCount{{BizType: "coupon", Reason: "delayed", Rows: 3, next: next}, {BizType: "coupon", Reason: "poison", Rows: 2}, {BizType: "other", Reason: "permanent", Rows: 1}},
	}
	s.splitDelayed()
	if got, want := fmt.Sprint(s.InboxRows), "[{coupon done 10} {coupon failed 2} {other failed 1}]"; got != want {
		t.Errorf("rows %s, want %s", got, want)
	}
	if len(s.FailedReasons) != 2 || s.FailedReasons[0].Reason != "poison" || s.FailedReasons[1].Reason != "permanent" {
		t.Errorf("reasons %+v, want poison and permanent", s.FailedReasons)
	}
	if len(s.Delayed) != 1 || s.Delayed[0] != (DelayedCount{BizType: "coupon", Rows: 3, Next: next}) {
		t.Errorf("delayed %+v, want coupon 3 next %s", s.Delayed, next)
	}
}

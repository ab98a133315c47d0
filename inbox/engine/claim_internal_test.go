package engine

import "testing"

// TestDecideClaim checks the one claim decision of both paths, Process and
// Batcher.runTx.
func TestDecideClaim(t *testing.T) {
	row := func(s Status, fp string) inboxRow { return inboxRow{status: s, fingerprint: fp} }
	for _, tc := range []struct {
		name          string
		fresh         bool
		r             inboxRow
		check, reopen bool
		want          claimOutcome
	}{
		{"a new row runs", true, row(StatusDone, "other"), true, false, claimRun},
		{"another meaning conflicts", false, row(StatusDone, "other"), true, false, claimConflict},
		{"another meaning unchecked (a replay, a later step)", false, row(StatusDone, "other"), false, false, claimDuplicate},
		{"done is a duplicate", false, row(StatusDone, "fp"), true, false, claimDuplicate},
		{"quarantined is a duplicate", false, row(StatusFailed, "fp"), true, false, claimDuplicate},
		{"quarantined and reopened resumes", false, row(StatusFailed, "fp"), true, true, claimResume},
		{"processing resumes", false, row(StatusProcessing, "fp"), true, false, claimResume},
		{"done stays done when reopening", false, row(StatusDone, "fp"), true, true, claimDuplicate},
	} {
		if got := decideClaim(tc.fresh, tc.r, "fp", tc.check, tc.reopen); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

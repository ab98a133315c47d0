package routercmd

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestVerifyFailedInboxRows checks that quarantined inbox rows, whose status is failed, are
// a finding of `router verify`. verify exits with code 1 and a line that counts them by
// reason and names the command that lists them. --allow-failed accepts them, and verify
// then exits with code 0 and prints the same line. A database without failed rows exits
// with code 0 without the flag.
func TestVerifyFailedInboxRows(t *testing.T) {
	testenv.Integration(t)
	d := quarantinedDB(t) // o-cli failed with retries_exhausted, and one poison message
	const line = "FAILED inbox rows: 2 (poison 1, retries_exhausted 1)"

	out, err := capture(t, "--dsn", d.DSN, "verify")
	if err == nil || ExitCode(err) != 1 || !strings.Contains(err.Error(), "2 failed inbox rows") || !strings.Contains(err.Error(), "--allow-failed") {
		t.Fatalf("verify with failed rows: %v (exit %d), want exit 1 naming 2 failed rows and --allow-failed\n%s", err, ExitCode(err), out)
	}
	mustContain(t, out, line+"; router inbox ls --status failed lists them")
	if strings.Contains(out, "VIOLATION") {
		t.Errorf("failed rows reported as a violation:\n%s", out)
	}

	out, err = capture(t, "--dsn", d.DSN, "verify", "--allow-failed")
	if err != nil {
		t.Fatalf("verify --allow-failed: %v (exit %d), want exit 0\n%s", err, ExitCode(err), out)
	}
	mustContain(t, out, line+", accepted by --allow-failed;")

	// The order is replayed once its cause is gone. The poison row is then the only failed
	// row left.
	if _, err := capture(t, "--dsn", d.DSN, "replay", "--biz-type", "coupon", "--order-id", "o-cli"); err != nil {
		t.Fatal(err)
	}
	out, err = capture(t, "--dsn", d.DSN, "verify")
	if ExitCode(err) != 1 {
		t.Fatalf("verify with a poison row: %v, want exit 1\n%s", err, out)
	}
	mustContain(t, out, "FAILED inbox rows: 1 (poison 1);")

	clean := testenv.DB(t, 4, registeredMigrations()...)
	if out, err := capture(t, "--dsn", clean.DSN, "verify"); err != nil || strings.Contains(out, "FAILED") {
		t.Fatalf("verify without failed rows: %v (exit %d), want exit 0\n%s", err, ExitCode(err), out)
	}
}

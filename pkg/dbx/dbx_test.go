package dbx_test

import (
	"context"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/testenv"
)

func TestParseDSN(t *testing.T) {
	cases := []struct {
		name, dsn, wantErr string
	}{
		{"ok", "u:p@tcp(127.0.0.1:3306)/onceflow", ""},
		{"empty", "", "empty"},
		{"garbage", "not a dsn", "expected user:pass@tcp(host:port)/db"},
		{"no database", "u:p@tcp(127.0.0.1:3306)/", "no database name"},
		{"multi statements", "u:p@tcp(127.0.0.1:3306)/x?multiStatements=true", "multiStatements"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mc, err := dbx.ParseDSN(tc.dsn)
			if tc.wantErr == "" {
				if err != nil || !mc.ParseTime || !mc.InterpolateParams || mc.Params["time_zone"] != "'+00:00'" {
					t.Fatalf("%+v %v", mc, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), ":p@") {
				t.Fatalf("password leaked: %v", err)
			}
		})
	}
	if mc, _ := dbx.ParseDSN("u:p@tcp(h:1)/d?interpolateParams=false"); mc.InterpolateParams {
		t.Fatal("an explicit interpolateParams=false must be kept")
	}
	// Time parameters are sent with microseconds (the driver keeps the setting private; its
	// DSN shows it), unless the DSN says otherwise.
	if mc, _ := dbx.ParseDSN("u:p@tcp(h:1)/d"); !strings.Contains(mc.FormatDSN(), "timeTruncate=1µs") {
		t.Fatalf("no timeTruncate=1µs in %s", mc.FormatDSN())
	}
	if mc, _ := dbx.ParseDSN("u:p@tcp(h:1)/d?timeTruncate=1s"); !strings.Contains(mc.FormatDSN(), "timeTruncate=1s") {
		t.Fatalf("an explicit timeTruncate must be kept: %s", mc.FormatDSN())
	}
}

func TestMaskDSN(t *testing.T) {
	if got := dbx.MaskDSN("user:s3cret@tcp(h:1)/d"); got != "user:***@tcp(h:1)/d" || strings.Contains(got, "s3cret") {
		t.Fatalf("MaskDSN = %q", got)
	}
}

func TestCheckIdent(t *testing.T) {
	for _, ok := range []string{"inbox", "outbox_2", "_x"} {
		if err := dbx.CheckIdent("table", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1x", "in box", "inbox;DROP", "a`b", strings.Repeat("a", 65)} {
		if err := dbx.CheckIdent("table", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzParseDSN: a DSN from configuration never panics the parser, and whatever it accepts
// has a database name, no multiStatements, and never shows the password when masked.
func FuzzParseDSN(f *testing.F) {
	for _, s := range []string{"u:p@tcp(127.0.0.1:3306)/onceflow", "", "u@/d", "u:p@tcp(h)/d?multiStatements=true", "u:p@unix(/tmp/s)/d?parseTime=false&x=%zz", "@/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		mc, err := dbx.ParseDSN(dsn)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error: %q", err)
			}
			return
		}
		if mc.DBName == "" || mc.MultiStatements || !mc.ParseTime {
			t.Fatalf("accepted %q as %+v", dsn, mc)
		}
		_ = dbx.MaskDSN(dsn)
	})
}

// Pools run READ COMMITTED for the whole session (no SET before every BEGIN), and Open
// refuses a DSN that would change that.
func TestOpenSessionIsolation(t *testing.T) {
	d := testenv.DB(t, 2)
	var iso string
	tx, err := d.DB.BeginTx(context.Background(), dbx.TxOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tx.QueryRow("SELECT @@tx_isolation").Scan(&iso); err != nil {
		t.Fatal(err)
	}
	if iso != "READ-COMMITTED" {
		t.Fatalf("transaction isolation %q, want READ-COMMITTED", iso)
	}
	sep := "?"
	if strings.Contains(d.DSN, "?") {
		sep = "&"
	}
	_, err = dbx.Open(context.Background(), dbx.Config{DSN: d.DSN + sep + "tx_isolation=%27REPEATABLE-READ%27"})
	if err == nil || !strings.Contains(err.Error(), "READ-COMMITTED") {
		t.Fatalf("Open with tx_isolation=REPEATABLE-READ: %v, want a refusal naming READ-COMMITTED", err)
	}
}

package dbx_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
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
	// Time parameters are sent with microseconds, unless the DSN says otherwise. The driver
	// keeps the setting private, and its DSN shows it.
	if mc, _ := dbx.ParseDSN("u:p@tcp(h:1)/d"); !strings.Contains(mc.FormatDSN(), "timeTruncate=1µs") {
		t.Fatalf("no timeTruncate=1µs in %s", mc.FormatDSN())
	}
	if mc, _ := dbx.ParseDSN("u:p@tcp(h:1)/d?timeTruncate=1s"); !strings.Contains(mc.FormatDSN(), "timeTruncate=1s") {
		t.Fatalf("an explicit timeTruncate must be kept: %s", mc.FormatDSN())
	}
}

func TestMaskDSN(t *testing.T) {
	cases := []struct {
		name, dsn, want, secret string
	}{
		{"plain", "user:s3cret@tcp(h:1)/d", "user:***@tcp(h:1)/d", "s3cret"},
		{"at in password", "onceflow:p@ssW0rd@tcp(127.0.0.1:3306)/db", "onceflow:***@tcp(127.0.0.1:3306)/db", "ssW0rd"},
		{"at in password, database x", "onceflow:p@ssW0rd@tcp(127.0.0.1:3306)/x", "onceflow:***@tcp(127.0.0.1:3306)/x", "ssW0rd"},
		{"ats and colons in password, tls param", "onceflow:p@ss:w@rd@tcp(127.0.0.1:3306)/x?tls=true", "onceflow:***@tcp(127.0.0.1:3306)/x?tls=true", "ss:w"},
		{"tls name not registered here", "onceflow:p@ss@tcp(127.0.0.1:3306)/x?tls=onceflow-1", "***@tcp(127.0.0.1:3306)/x?tls=onceflow-1", "p@ss"},
		{"password ends with at", "u:secret@@tcp(h:1)/d", "u:***@tcp(h:1)/d", "secret"},
		{"colon in password", "u:a:b:c@tcp(h:1)/d", "u:***@tcp(h:1)/d", "a:b:c"},
		{"slash in password", "u:pa/ss/wd@tcp(h:1)/d", "u:***@tcp(h:1)/d", "pa/ss"},
		{"paren in password", "u:pa(ss)@tcp(h:1)/d", "u:***@tcp(h:1)/d", "pa(ss)"},
		{"everything in password", "u:@:/()x@y@unix(/tmp/my.sock)/d?parseTime=true", "u:***@unix(/tmp/my.sock)/d?parseTime=true", "@:/()x@y"},
		{"params kept as written", "u:pw1234@tcp(h:1)/d?timeout=3s&interpolateParams=false", "u:***@tcp(h:1)/d?timeout=3s&interpolateParams=false", "pw1234"},
		{"default address", "u:pw1234@/d", "u:***@/d", "pw1234"},
		{"empty password", "u:@tcp(h:1)/d", "u:@tcp(h:1)/d", ""},
		{"no password", "u@tcp(h:1)/d", "u@tcp(h:1)/d", ""},
		{"no credentials", "tcp(h:1)/d", "tcp(h:1)/d", ""},
		{"empty", "", "", ""},
		{"unparseable with tcp", "u:pa@ss@tcp(h:1/d", "***@tcp(h:1/d", "pa@ss"},
		{"unparseable with unix", "u:pa@ss@unix(/s/d?x=%zz", "***@unix(/s/d?x=%zz", "pa@ss"},
		{"unparseable, last at", "u:pa@ss@nowhere", "***@nowhere", "pa@ss"},
		{"unparseable, no at", "not a dsn", "not a dsn", ""},
		{"unparseable, no at but a colon", "u:secret(tcp(h:1/d", "***tcp(h:1/d", "secret"},
		{"unparseable, no at, no protocol", "u:secret/d", "***", "secret"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := dbx.MaskDSN(tc.dsn)
			if got != tc.want {
				t.Errorf("MaskDSN(%q) = %q, want %q", tc.dsn, got, tc.want)
			}
			if tc.secret != "" && strings.Contains(got, tc.secret) {
				t.Errorf("MaskDSN(%q) = %q shows the password", tc.dsn, got)
			}
		})
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

// FuzzParseDSN checks that a DSN from configuration never panics the parser. Whatever it
// accepts has a database name and no multiStatements, and never shows the password when
// masked.
func FuzzParseDSN(f *testing.F) {
	for _, s := range []string{"u:p@tcp(127.0.0.1:3306)/onceflow", "u:p@tcp(a:1,b:2, c)/d", "", "u@/d", "u:p@tcp(h)/d?multiStatements=true", "u:p@unix(/tmp/s)/d?parseTime=false&x=%zz", "@/"} {
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

// FuzzMaskDSN checks that a DSN the driver parses never shows its password when masked.
// The exceptions are a password whose text also stands outside the password field, and a
// password made of the mask's own '*'. The masked DSN parses to the same settings with ***
// as the password. A DSN the driver cannot parse shows nothing before the '@' of its
// protocol part, unless it is a postgres:// URL.
func FuzzMaskDSN(f *testing.F) {
	for _, s := range []string{"u:p@tcp(127.0.0.1:3306)/onceflow", "onceflow:p@ssW0rd@tcp(127.0.0.1:3306)/db", "onceflow:p@ss:w@rd@tcp(127.0.0.1:3306)/x?tls=true",
		"u:a:b/c(d)@unix(/tmp/s)/d?parseTime=true", "u:@tcp(h:1)/d", "u@/d", "u:pa@ss@tcp(h:1/d", "u:secret/d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		out := dbx.MaskDSN(dsn)
		mc, err := mysql.ParseDSN(dsn)
		if err != nil {
			if strings.Contains(out, "@") && !dbx.IsPostgresDSN(dsn) && !strings.HasPrefix(out, "***@") {
				t.Fatalf("MaskDSN(%q) = %q: an unparseable DSN showing an '@' must start with ***@", dsn, out)
			}
			return
		}
		pw := mc.Passwd
		if pw == "" || strings.Contains(mc.User, "=") {
			return // a user holding '=' is masked as a keyword/value string
		}
		if cred := mc.User + ":" + pw + "@"; strings.HasPrefix(dsn, cred) && !strings.Contains(pw, "*") {
			outside := mc.User + ":\x00" + dsn[len(cred)-1:]
			if !strings.Contains(outside, pw) && strings.Contains(out, pw) {
				t.Fatalf("MaskDSN(%q) = %q shows the password %q", dsn, out, pw)
			}
		}
		back, err := mysql.ParseDSN(out)
		if err != nil {
			t.Fatalf("MaskDSN(%q) = %q does not parse: %v", dsn, out, err)
		}
		if back.Passwd != "***" || back.User != mc.User || back.Net != mc.Net || back.Addr != mc.Addr || back.DBName != mc.DBName {
			t.Fatalf("MaskDSN(%q) = %q parses as %+v, want %+v with password ***", dsn, out, back, mc)
		}
	})
}

// Pools run READ COMMITTED for the whole session, with no SET before every BEGIN. Open
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

// db.dialect is the pool's dialect that DialectOf returns. This holds although Open reads
// the session's isolation, which asks the pool's dialect, before it records it.
func TestOpenDialectSetting(t *testing.T) {
	d := testenv.DB(t, 1)
	want := []dbx.Dialect{dbx.Postgres}
	if testenv.Dialect().MySQLFamily() {
		want = []dbx.Dialect{dbx.MySQL8, dbx.MariaDB}
	}
	for _, w := range want {
		db, err := dbx.Open(context.Background(), dbx.Config{DSN: d.DSN, Dialect: string(w)})
		if err != nil {
			t.Fatal(err)
		}
		if got := dbx.DialectOf(db); got != w {
			t.Errorf("db.dialect %s: pool's dialect %s", w, got)
		}
		db.Close()
	}
}

// TestIsolationRefused checks that a pool of one's own left at the server's REPEATABLE READ,
// MariaDB's default, never begins an onceflow transaction. CheckIsolation says why. The
// same database through a READ COMMITTED pool passes both.
func TestIsolationRefused(t *testing.T) {
	d := testenv.DB(t, 2)
	ctx := context.Background()
	cases := []struct {
		name, param string
		refused     bool
	}{
		{"repeatable read", "'REPEATABLE-READ'", true},
		{"serializable", "'SERIALIZABLE'", true},
		{"read uncommitted", "'READ-UNCOMMITTED'", true},
		{"read committed", "'READ-COMMITTED'", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mc, err := mysql.ParseDSN(d.DSN)
			if err != nil {
				t.Fatal(err)
			}
			mc.Params = map[string]string{"tx_isolation": tc.param}
			db, err := sql.Open("mysql", mc.FormatDSN()) // a user's own pool, not dbx.Open
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(1) // one session: the one SET SESSION below changes
			ran := false
			err = dbx.InTx(ctx, db, func(tx *sql.Tx) error {
				ran = true
				_, err := tx.ExecContext(ctx, "DO 1")
				return err
			})
			cerr := dbx.CheckIsolation(ctx, db)
			if !tc.refused {
				if err != nil || !ran || cerr != nil {
					t.Fatalf("InTx = %v (ran %v), CheckIsolation = %v; want both nil", err, ran, cerr)
				}
				return
			}
			if ran || !errors.Is(err, dbx.ErrIsolation) || !errors.Is(cerr, dbx.ErrIsolation) {
				t.Fatalf("InTx = %v (ran %v), CheckIsolation = %v; want both refused with ErrIsolation", err, ran, cerr)
			}
			if want := strings.Trim(tc.param, "'"); !strings.Contains(cerr.Error(), want) || !strings.Contains(cerr.Error(), "tx_isolation='READ-COMMITTED'") {
				t.Fatalf("error %q does not name the level %s and the fix", cerr, want)
			}
			// A refusal is not remembered. Once its session is fixed, the pool is accepted.
			if _, err := db.ExecContext(ctx, "SET SESSION tx_isolation = 'READ-COMMITTED'"); err != nil {
				t.Fatal(err)
			}
			if err := dbx.InTx(ctx, db, func(*sql.Tx) error { return nil }); err != nil {
				t.Fatalf("InTx after the session was set to READ COMMITTED: %v", err)
			}
		})
	}
	// The server's default sessions, with no tx_isolation in the DSN, are REPEATABLE READ
	// here. A user's own sql.Open meets that case.
	mc, _ := mysql.ParseDSN(d.DSN)
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	iso, err := dbx.SessionIsolation(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := dbx.InTx(ctx, db, func(*sql.Tx) error { return nil }); (iso == dbx.ReadCommitted) != (err == nil) {
		t.Fatalf("server default session isolation %s: InTx = %v", iso, err)
	}
}

// TestIsolationCheckedOncePerPool checks that InTx checks a pool once. A pool that failed
// the check is checked again, because an error such as a connection error is no verdict.
func TestIsolationCheckedOncePerPool(t *testing.T) {
	d := testenv.DB(t, 1)
	ctx := context.Background()
	var before, after int64
	read := func(v *int64) {
		if err := d.DB.QueryRowContext(ctx, "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'COM_SELECT'").Scan(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := dbx.InTx(ctx, d.DB, func(*sql.Tx) error { return nil }); err != nil { // the first sight of the pool
		t.Fatal(err)
	}
	read(&before)
	for range 5 {
		if err := dbx.InTx(ctx, d.DB, func(*sql.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	read(&after)
	if n := after - before - 1; n != 0 { // the second read counts itself
		t.Fatalf("5 transactions ran %d SELECTs on the pool's one connection, want 0 (the check runs once per pool)", n)
	}
}

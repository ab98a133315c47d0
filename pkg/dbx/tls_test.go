package dbx_test

import (
	"context"
	"crypto/x509"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Bad db.tls.* settings are refused before anything connects, naming the key.
func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("nothing"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tls  dbx.TLS
		want string
	}{
		{dbx.TLS{CAFile: filepath.Join(dir, "missing.pem")}, "db.tls.ca_file"},
		{dbx.TLS{CAFile: notPEM}, "no PEM certificate"},
		{dbx.TLS{CertFile: notPEM}, "set both or neither"},
		{dbx.TLS{CertFile: notPEM, KeyFile: notPEM}, "db.tls.cert_file/key_file"},
	} {
		if _, err := dbx.RegisterTLS(tc.tls); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.tls, err, tc.want)
		}
	}
	if _, err := (dbx.Config{DSN: "u:p@tcp(h:1)/d?tls=true", TLS: dbx.TLS{ServerName: "h"}}).DriverConfig(); err == nil || !strings.Contains(err.Error(), "use one") {
		t.Errorf("tls= in the DSN and db.tls.* both: %v", err)
	}
	if _, err := (dbx.Config{DSN: "u:p@tcp(h:1)/d", TLS: dbx.TLS{ServerName: "h"}}).DriverConfig(); err != nil {
		t.Errorf("server name alone (system roots): %v", err)
	}
	a, err1 := dbx.RegisterTLS(dbx.TLS{ServerName: "h"})
	b, err2 := dbx.RegisterTLS(dbx.TLS{ServerName: "h"})
	if err1 != nil || err2 != nil || a != b {
		t.Errorf("the same settings registered twice: %q %v, %q %v", a, err1, b, err2)
	}
}

// The MariaDB user of scripts/infra.sh that must use TLS (REQUIRE SSL) connects with
// db.tls.* (the local CA, optionally a client certificate, the password given apart from the
// DSN), and the same user without TLS, or trusting another CA, or expecting another name, is
// refused.
func TestTLSConnection(t *testing.T) {
	d := testenv.DB(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mc, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	user, pass, _ := strings.Cut(testenv.TLSAppUser(), ":")
	mc.User, mc.Passwd = user, ""
	dsn := mc.FormatDSN() // no password in the DSN: it comes from Config.Password (db.password_file)
	ca := testenv.TLSFile("ca.pem")
	if _, err := os.Stat(ca); err != nil {
		t.Fatalf("%v: `scripts/infra.sh up` writes the local CA there (or set OFTEST_TLS_DIR)", err)
	}

	for _, tc := range []struct {
		name string
		tls  dbx.TLS
	}{
		{"CA", dbx.TLS{CAFile: ca}},
		{"CA and client certificate", dbx.TLS{CAFile: ca, CertFile: testenv.TLSFile("client.pem"), KeyFile: testenv.TLSFile("client.key")}},
		{"CA and server name", dbx.TLS{CAFile: ca, ServerName: "localhost"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := dbx.Open(ctx, dbx.Config{DSN: dsn, Password: pass, TLS: tc.tls, MaxOpenConns: 1})
			if err != nil {
				t.Fatalf("open over TLS as %s: %v", user, err)
			}
			defer db.Close()
			var name, version string
			if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_version'").Scan(&name, &version); err != nil || !strings.HasPrefix(version, "TLSv1.") {
				t.Fatalf("Ssl_version %q (%v): the session is not encrypted", version, err)
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM inbox").Scan(&n); err != nil {
				t.Fatalf("read the inbox as %s: %v", user, err)
			}
		})
	}

	refused := func(name string, c dbx.Config, want func(error) bool) {
		t.Run(name, func(t *testing.T) {
			c.MaxOpenConns = 1
			db, err := dbx.Open(ctx, c)
			if err == nil {
				db.Close()
				t.Fatal("connected")
			}
			if !want(err) {
				t.Fatalf("refused with %v", err)
			}
			if pass != user && strings.Contains(err.Error(), pass) {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
	accessDenied := func(err error) bool {
		var me *mysql.MySQLError
		return errors.As(err, &me) && me.Number == 1045
	}
	refused("no TLS", dbx.Config{DSN: dsn, Password: pass}, accessDenied)
	off := *mc
	off.TLSConfig = "false"
	refused("TLS turned off in the DSN", dbx.Config{DSN: off.FormatDSN(), Password: pass}, accessDenied)
	refused("another CA", dbx.Config{DSN: dsn, Password: pass, TLS: dbx.TLS{CAFile: testenv.OtherCA(t)}}, func(err error) bool {
		var ua x509.UnknownAuthorityError
		return errors.As(err, &ua) || strings.Contains(err.Error(), "unknown authority")
	})
	refused("another name", dbx.Config{DSN: dsn, Password: pass, TLS: dbx.TLS{CAFile: ca, ServerName: "db.example"}}, func(err error) bool {
		return strings.Contains(err.Error(), "db.example")
	})

	// The name RegisterTLS returns works in a DSN of one's own, as tls=<name>.
	name, err := dbx.RegisterTLS(dbx.TLS{CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	own := *mc
	own.Passwd, own.TLSConfig = pass, name
	db, err := sql.Open("mysql", own.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("sql.Open with tls=%s: %v", name, err)
	}
}

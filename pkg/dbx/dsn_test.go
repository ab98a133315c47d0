package dbx_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// The servers of a DSN are read from its address part only, as go-sql-driver reads it. A
// database name or a parameter holding "@tcp(a,b)" never names them, and is refused.
func TestParseDSNReadsTheAddressPartOnly(t *testing.T) {
	for _, tc := range []struct {
		name, dsn, addr string
	}{
		{"one server", "u:p@tcp(127.0.0.1:3306)/db", "127.0.0.1:3306"},
		{"a list", "u:p@tcp(127.0.0.1:4306, 127.0.0.1:4307,h:4308)/db", "127.0.0.1:4306,127.0.0.1:4307,h:4308"},
		{"a list without ports", "u:p@tcp(a,b)/db", "a,b"},
		{"a list of IPv6 addresses", "u:p@tcp([::1]:4306,[::1]:4307)/db", "[::1]:4306,[::1]:4307"},
		{"a list, no network named", "u:p@(a:1,b:2)/db", "a:1,b:2"},
		{"a password holding @tcp( and a comma", "u:p@tcp(x:1,y:2)@tcp(127.0.0.1:3306)/db", "127.0.0.1:3306"},
		{"a list, a password holding @tcp(", "u:p@tcp(x:1,y:2)@tcp(a:1,b:2)/db", "a:1,b:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc, err := dbx.ParseDSN(tc.dsn)
			if err != nil || mc.Addr != tc.addr {
				t.Fatalf("ParseDSN(%q): addr %q, %v; want %q", tc.dsn, addrOf(mc), err, tc.addr)
			}
		})
	}
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"a parameter", "u:p@tcp(127.0.0.1:3306)/db?x=@tcp(127.0.0.1:28997,127.0.0.1:28996)", "parameter x holds an address"},
		{"a parameter, one server", "u:p@tcp(127.0.0.1:3306)/db?timeout=5s&x=@tcp(127.0.0.1:28997)", "parameter x holds an address"},
		{"a parameter, escaped", "u:p@tcp(127.0.0.1:3306)/db?x=%40tcp(127.0.0.1:28997,127.0.0.1:28996)", "parameter x holds an address"},
		{"a parameter's name", "u:p@tcp(127.0.0.1:3306)/db?@tcp(127.0.0.1:28997,127.0.0.1:28996)=1", "a parameter name holds an address"},
		{"the database name", "u:p@tcp(127.0.0.1:3306)/db@tcp(127.0.0.1:28997,127.0.0.1:28996)", "the database name holds an address"},
		{"the database name, a list", "u:p@tcp(a:1,b:2)/db@unix(sock)", "the database name holds an address"},
		{"an empty server", "u:p@tcp(a:1,,b:2)/db", "server 2 of tcp(a:1,,b:2) is empty"},
		{"a trailing comma", "u:p@tcp(a:1,)/db", "server 2 of tcp(a:1,) is empty"},
		{"a bad port", "u:p@tcp(a:1,b:x)/db", `server "b:x" of tcp(a:1,b:x) is not host:port`},
		{"a port out of range", "u:p@tcp(a:1,b:70000)/db", `server "b:70000" of tcp(a:1,b:70000) is not host:port`},
		{"no host", "u:p@tcp(a:1,:2)/db", `server ":2" of tcp(a:1,:2) is not host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc, err := dbx.ParseDSN(tc.dsn)
			if err == nil {
				t.Fatalf("ParseDSN(%q) accepted, address %q", tc.dsn, mc.Addr)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad database dsn") {
				t.Fatalf("ParseDSN(%q): %v, want %q", tc.dsn, err, tc.want)
			}
			if strings.Contains(err.Error(), ":p@") {
				t.Fatalf("password shown: %v", err)
			}
		})
	}
}

// A PostgreSQL URL names its servers in its host part. A host, hostaddr or port parameter
// beside it is refused. Such a parameter is taken where the URL names no host, as for a
// Unix socket.
func TestPostgresDSNServersFromTheHostPart(t *testing.T) {
	for _, k := range []string{"host=evil", "hostaddr=127.0.0.2", "port=28997", "h%6Fst=evil"} {
		dsn := "postgres://app:p@127.0.0.1:5432/shop?sslmode=disable&" + k
		if _, err := dbx.ParseDSNInfo(dsn); err == nil || !strings.Contains(err.Error(), "names a server besides the address part") {
			t.Errorf("ParseDSNInfo(%q): %v, want a refusal", dsn, err)
		}
	}
	info, err := dbx.ParseDSNInfo("postgres://app@/shop?host=/run/postgresql")
	if err != nil || info.Addr != "/run/postgresql:5432" {
		t.Errorf("a Unix socket: %+v, %v", info, err)
	}
}

func addrOf(mc *mysql.Config) string {
	if mc == nil {
		return ""
	}
	return mc.Addr
}

// Open connects to no host named outside the address part. The listeners stand where the
// smuggled addresses point; the address part names a port where nothing listens. The same
// listeners named in the address part are dialed, which shows the check can fail.
func TestOpenDialsNoSmuggledHost(t *testing.T) {
	a, b := countingListener(t), countingListener(t)
	closed := closedPort(t)
	smuggled := "@tcp(" + a.addr + "," + b.addr + ")"
	for _, dsn := range []string{
		"u:SeCrEtK8@tcp(" + closed + ")/db?x=" + smuggled,
		"u:SeCrEtK8@tcp(" + closed + ")/db" + smuggled,
	} {
		_, err := dbx.Open(context.Background(), dbx.Config{DSN: dsn})
		if err == nil || !strings.Contains(err.Error(), "holds an address") {
			t.Errorf("Open(%q): %v, want a refusal", dbx.MaskDSN(dsn), err)
		}
		if err != nil && strings.Contains(err.Error(), "SeCrEtK8") {
			t.Errorf("password shown: %v", err)
		}
	}
	if n := a.dials() + b.dials(); n != 0 {
		t.Fatalf("%d connections to the hosts named in the parameters or the database name", n)
	}
	_, err := dbx.Open(context.Background(), dbx.Config{DSN: "u:SeCrEtK8@tcp(" + a.addr + "," + b.addr + ")/db"})
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("Open on listeners that close every connection: %v, want unreachable", err)
	}
	if a.dials() == 0 || b.dials() == 0 {
		t.Fatalf("the address part's servers dialed %d and %d times, want both", a.dials(), b.dials())
	}
}

// listener counts the connections to a local port and closes each at once. A driver that
// dialed waits for the server's greeting, which ends as EOF only after the accept. So every
// dial is counted by the time the dialing call returns.
type listener struct {
	addr string
	n    atomic.Int64
}

func (l *listener) dials() int64 { return l.n.Load() }

func countingListener(t *testing.T) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return l
}

// closedPort is a local address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// Every DSN form is masked. That covers the credentials and password parameters of a
// PostgreSQL URL. It covers a keyword/value string, plain, quoted, with escapes or
// malformed. It covers a go-sql-driver DSN with password parameters.
func TestMaskDSNForms(t *testing.T) {
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"url", "postgres://app:SeCrEtK8@127.0.0.1:5432/shop", "postgres://app:***@127.0.0.1:5432/shop"},
		{"postgresql url", "postgresql://app:SeCrEtK8@h/shop?sslmode=disable", "postgresql://app:***@h/shop?sslmode=disable"},
		{"url, password parameter", "postgres://app@h/shop?password=SeCrEtK8", "postgres://app@h/shop?password=***"},
		{"url, both and sslpassword", "postgres://app:SeCrEtK8@h/shop?password=SeCrEtK9&sslpassword=SeCrEtK7", "postgres://app:***@h/shop?password=***&sslpassword=***"},
		{"url, encoded parameter name", "postgres://app@h/shop?pass%77ord=SeCrEtK8", "postgres://app@h/shop?pass%77ord=***"},
		{"url, empty password", "postgres://app:@h/shop", "postgres://app:@h/shop"},
		{"url, no credentials", "postgres://h:5432/shop", "postgres://h:5432/shop"},
		{"url, '@' in the password", "postgres://app:SeCr@EtK8@h/shop", "postgres://app:***@h/shop"},
		{"url, '/' in the password", "postgres://app:SeCr/EtK8@h/shop", "postgres://***@h/shop"},
		{"url, '?' in the password", "postgres://app:SeCr?EtK8@h/shop", "postgres://app:***@h/shop"},
		{"url, unparseable", "postgres://app:SeCrEtK8@h:x/shop", "postgres://app:***@h:x/shop"},
		{"keyword", "user=app password=SeCrEtK8 host=127.0.0.1 dbname=shop", "user=app password=*** host=127.0.0.1 dbname=shop"},
		{"keyword, quoted", "user=app password='SeCr EtK8' host=h dbname=shop", "user=app password=*** host=h dbname=shop"},
		{"keyword, quoted with an escaped quote", `password='SeCr\' EtK8' host=h`, "password=*** host=h"},
		{"keyword, escaped space", `host=h password=SeCr\ EtK8 dbname=shop`, "host=h password=*** dbname=shop"},
		{"keyword, spaces around =", "host=h password = SeCrEtK8 dbname=shop", "host=h password = *** dbname=shop"},
		{"keyword, unterminated quote", "host=h password='SeCr EtK8", "host=h password=***"},
		{"keyword, sslpassword", "host=h sslpassword=SeCrEtK8", "host=h sslpassword=***"},
		{"keyword, a socket path", "host=/var/run/postgresql password=SeCrEtK8 dbname=shop", "host=/var/run/postgresql password=*** dbname=shop"},
		{"keyword, '=' missing", "host=h password SeCrEtK8 dbname=shop", "host=h password***"},
		{"keyword, no '=' at the end", "host=h password SeCrEtK8", "host=h password***"},
		{"keyword, '@' in it", "user=app password=SeCrEtK8 host=h@x", "***@x"},
		{"keyword, a dotted key first", "a.b=1 password=SeCrEtK8", "a.b=1 password=***"},
		{"keyword, a word before the first key", "xx password=SeCrEtK8 host=h", "xx*** host=h"},
		{"keyword, IPv6 host", "host=::1 password=SeCrEtK8", "host=::1 password=***"},
		{"mysql, password parameter", "u:SeCrEtK7@tcp(h:1)/d?password=SeCrEtK8&tls=false", "u:***@tcp(h:1)/d?password=***&tls=false"},
		{"mysql, unparseable, password parameter", "u:SeCrEtK7@tcp(h:1/d?password=SeCrEtK8", "***@tcp(h:1/d?password=***"},
		{"mysql, unparseable, a later password parameter", "u:pw7@tcp(h:1/d?x=1&password=SeCrEtK8", "***@tcp(h:1/d?x=1&password=***"},
		{"mysql, no '@', a parameter", "u:SeCrEtK8/d?x=1", "***"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := dbx.MaskDSN(tc.dsn)
			if got != tc.want {
				t.Errorf("MaskDSN(%q) = %q, want %q", tc.dsn, got, tc.want)
			}
			for _, s := range []string{"SeCr", "EtK"} {
				if strings.Contains(got, s) {
					t.Errorf("MaskDSN(%q) = %q shows part of a password", tc.dsn, got)
				}
			}
		})
	}
}

// A DSN of any form refused before connecting shows its password in no error. It shows it
// neither in the masked DSN nor in the driver's message, which may quote parts of it. pgx
// quotes the DSN with its password masked as best it can. It shows the part of a password
// after an unencoded '@'. go-sql-driver quotes the text before the slash when it names no
// network it knows.
func TestDSNErrorsHideThePassword(t *testing.T) {
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"keyword", "user=app password=SeCrEtK8 host=127.0.0.1 dbname=shop", "keyword/value"},
		{"keyword, quoted", "user=app password='SeCr EtK8' host=127.0.0.1 dbname=shop", "keyword/value"},
		{"keyword, a socket path", "user=app host=/tmp password=SeCrEtK8 dbname=shop", "keyword/value"},
		{"url, bad port", "postgres://app:SeCrEtK8@h:x/shop", "invalid port"},
		{"url, '@' in the password", "postgres://app:SeCr@EtK8@h/shop?sslmode=bogus", "sslmode is invalid"},
		{"url, password parameter", "postgres://app@h/shop?password=SeCrEtK8&sslmode=bogus", "sslmode is invalid"},
		{"url, bad escape", "postgres://app:SeCr%zzEtK8@h/shop", "percent-encoded"},
		{"url, another host", "postgres://app:SeCrEtK8@h/shop?host=evil", "parameter host"},
		{"url, no database", "postgres://app:SeCrEtK8@h/", "no database name"},
		{"mysql, no '@'", "app:SeCrEtK8/shop", "no tcp(host:port)"},
		{"mysql, unknown network", "app:SeCrEtK8@foo/shop", "no tcp(host:port)"},
		{"mysql, bad parameter", "app:SeCrEtK8@tcp(h:1)/shop?password=SeCrEtK8&timeout=x", "invalid duration"},
		{"mysql, no slash", "app:SeCrEtK8@tcp(h:1)", "missing the slash"},
		{"mysql, multiStatements", "app:SeCrEtK8@tcp(h:1)/shop?multiStatements=true", "multiStatements"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dbx.ParseDSNInfo(tc.dsn)
			if err == nil {
				t.Fatalf("ParseDSNInfo(%q) accepted", tc.dsn)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			for _, s := range []string{"SeCr", "EtK"} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q shows part of the password", err)
				}
			}
		})
	}
	// The dialect check quotes the DSN too.
	err := dbx.Config{DSN: "user=app password=SeCrEtK8 host=h dbname=shop", Dialect: "postgres"}.WithDefaults().Validate()
	if err == nil || strings.Contains(err.Error(), "SeCrEtK8") {
		t.Errorf("Validate: %v", err)
	}
}

// FuzzMaskPostgresDSN checks that a DSN pgx parses, URL or keyword/value, never shows the
// password pgx reads from it when masked. The exceptions are a password whose text stands
// in the DSN more than once, or holds the mask's own '*'.
func FuzzMaskPostgresDSN(f *testing.F) {
	for _, s := range []string{"postgres://app:SeCrEtK8@h:5432/shop", "postgres://app@h/shop?password=SeCrEtK8", "postgresql://app:Se%40cr@h1,h2:5433/shop",
		"user=app password=SeCrEtK8 host=h dbname=shop", "password='a b\\' c' host=h", `password=a\ b host=h`, "host = h password = SeCrEtK8", "a.b=1 password=SeCrEtK8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		pc, err := pgconn.ParseConfig(dsn)
		if err != nil {
			return
		}
		pw := pc.Password
		if len(pw) < 3 || strings.Contains(pw, "*") || strings.Count(dsn, pw) != 1 {
			return
		}
		if out := dbx.MaskDSN(dsn); strings.Contains(out, pw) {
			t.Fatalf("MaskDSN(%q) = %q shows the password %q", dsn, out, pw)
		}
	})
}

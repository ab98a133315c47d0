package routercmd

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// runOutput runs the command line in-process as Main does and returns all it shows. That is
// its standard output, its standard error with the logs, and the error line that Main
// prints.
func runOutput(t *testing.T, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	runErr := Run(context.Background(), args)
	os.Stdout, os.Stderr = oldOut, oldErr
	_ = w.Close()
	out := <-done
	if runErr != nil {
		out += "router: " + runErr.Error() + "\n"
	}
	return out, runErr
}

// dialCounter counts the connections to a local port and closes each at once. A driver that
// dialed waits for the server's greeting, which ends as EOF only after the accept, so every
// dial is counted by the time the command returns.
type dialCounter struct {
	addr string
	n    atomic.Int64
}

func newDialCounter(t *testing.T) *dialCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dialCounter{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return d
}

// TestDSNSmuggledAddressRefused checks that a DSN whose parameters or database name hold
// another address, such as "@tcp(a,b)", is refused before anything connects. The command
// exits with code 2 and a message that names what is wrong. The password is not shown, and
// no host that the DSN names gets a connection. The same listeners named in the address
// part are dialed, which shows the count can fail.
func TestDSNSmuggledAddressRefused(t *testing.T) {
	a, b := newDialCounter(t), newDialCounter(t)
	smuggled := "@tcp(" + a.addr + "," + b.addr + ")"
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"in a parameter", "user:pW0rdX1@tcp(127.0.0.1:3306)/db?x=" + smuggled, "parameter x holds an address"},
		{"in the database name", "user:pW0rdX1@tcp(127.0.0.1:3306)/db" + smuggled, "the database name holds an address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runOutput(t, "--dsn", tc.dsn, "verify")
			if got := ExitCode(err); got != 2 {
				t.Fatalf("exit code %d, want 2 (%v)", got, err)
			}
			for _, w := range []string{"db.dsn", "bad database dsn", tc.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(out, "pW0rdX1") {
				t.Errorf("the password shows in the output:\n%s", out)
			}
		})
	}
	if n := a.n.Load() + b.n.Load(); n != 0 {
		t.Fatalf("%d connections to the hosts named outside the address part", n)
	}

	out, err := runOutput(t, "--dsn", "user:pW0rdX1@tcp("+a.addr+","+b.addr+")/db", "verify")
	if got := ExitCode(err); got != 1 || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("servers that close every connection: exit %d (%v), want 1, unreachable", got, err)
	}
	if a.n.Load() == 0 || b.n.Load() == 0 {
		t.Fatalf("the address part's servers dialed %d and %d times, want both", a.n.Load(), b.n.Load())
	}
	if strings.Contains(out, "pW0rdX1") {
		t.Errorf("the password shows in the output:\n%s", out)
	}
}

// TestDSNPasswordNeverShown checks that a bad DSN of any form exits with code 2, and its
// password shows nowhere in the output. The forms are a PostgreSQL keyword/value string, a
// URL that pgx refuses, a go-sql-driver DSN with a password parameter or without its '@',
// and a DSN that does not match db.dialect.
func TestDSNPasswordNeverShown(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"keyword/value", []string{"--dsn", "user=app password=SeCrEtK8 host=127.0.0.1 dbname=shop", "verify"}, "keyword/value"},
		{"keyword/value, quoted", []string{"--dsn", "user=app password='SeCr EtK8' host=127.0.0.1 dbname=shop", "verify"}, "keyword/value"},
		{"keyword/value, migrate", []string{"migrate", "--admin-dsn", "user=app password=SeCrEtK8 host=127.0.0.1 dbname=shop"}, "db.admin_dsn"},
		{"url, bad port", []string{"--dsn", "postgres://app:SeCrEtK8@127.0.0.1:x/shop", "verify"}, "invalid port"},
		{"url, '@' in the password", []string{"--dsn", "postgres://app:SeCr@EtK8@127.0.0.1/shop?sslmode=bogus", "verify"}, "sslmode"},
		{"url, password parameter", []string{"--dsn", "postgres://app@127.0.0.1/shop?password=SeCrEtK8&sslmode=bogus", "verify"}, "sslmode"},
		{"mysql, password parameter", []string{"--dsn", "app:SeCrEtK7@tcp(127.0.0.1:3306)/shop?password=SeCrEtK8&timeout=x", "verify"}, "invalid duration"},
		{"mysql, no '@'", []string{"--dsn", "app:SeCrEtK8/shop", "verify"}, "no tcp(host:port)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runOutput(t, tc.args...)
			if got := ExitCode(err); got != 2 {
				t.Fatalf("exit code %d, want 2 (%v)", got, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			for _, s := range []string{"SeCr", "EtK"} {
				if strings.Contains(out, s) {
					t.Errorf("part of the password shows in the output:\n%s", out)
				}
			}
		})
	}
	t.Run("dialect mismatch", func(t *testing.T) {
		t.Setenv("ONCEFLOW_DB_DIALECT", "mariadb")
		out, err := runOutput(t, "--dsn", "postgres://app@127.0.0.1/shop?password=SeCrEtK8", "verify")
		if got := ExitCode(err); got != 2 || !strings.Contains(err.Error(), "does not match") {
			t.Fatalf("exit code %d (%v), want 2, does not match", got, err)
		}
		if strings.Contains(out, "SeCrEtK8") {
			t.Errorf("the password shows in the output:\n%s", out)
		}
	})
}

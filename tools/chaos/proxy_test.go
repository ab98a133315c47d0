package main

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// echo serves line echo on a local port.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(l)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	_, err := bufio.NewReader(c).ReadString('\n')
	return time.Since(start), err
}

func TestProxyLatencyResetCut(t *testing.T) {
	p, err := newProxy("test", "127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	if err := p.SetLatency(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(c, 2*time.Second); err != nil || d < 100*time.Millisecond {
		t.Fatalf("latency: round trip %s (want ≥ 100ms: 50ms each way), %v", d, err)
	}
	if err := p.SetLatency(0); err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(c, 2*time.Second); err != nil || d >= 100*time.Millisecond {
		t.Fatalf("latency healed: round trip %s, %v", d, err)
	}

	// A reset window: the connection carrying data in it is reset.
	done := make(chan error, 1)
	go func() { done <- p.Reset(500 * time.Millisecond) }()
	time.Sleep(100 * time.Millisecond)
	if _, err := roundTrip(c, time.Second); err == nil {
		t.Fatal("a connection used during a reset window still works")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A cut: nothing gets through, neither on a new connection; healing closes them.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := roundTrip(c2, 2*time.Second); err != nil {
		t.Fatalf("after the reset window: %v", err)
	}
	if err := p.SetCut(true); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c2, 300*time.Millisecond); err == nil {
		t.Fatal("a connection works during a cut")
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err == nil {
		if _, err := roundTrip(c3, 300*time.Millisecond); err == nil {
			t.Fatal("a new connection works during a cut")
		}
		c3.Close()
	}
	p.Heal()
	c4, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	if _, err := roundTrip(c4, 2*time.Second); err != nil {
		t.Fatalf("after healing: %v", err)
	}
	if got := p.Stats(); got != "connections=4 latency=1 resets=1 cuts=1" {
		t.Errorf("stats %q", got)
	}
}

// TestProxyCarriesTheDatabase puts the proxy in front of the test database (MariaDB's or,
// with OFTEST_DB=postgres, PostgreSQL's wire protocol: the proxy only moves bytes):
// queries go through it, fail while a reset window or a cut lasts, and work again after.
func TestProxyCarriesTheDatabase(t *testing.T) {
	d := testenv.DB(t, 2)
	info, err := dbx.ParseDSNInfo(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProxy("db", "127.0.0.1:0", info.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	db, err := openDB(strings.Replace(d.DSN, info.Addr, p.Addr(), 1))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	count := func(timeout time.Duration) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var n int
		err := db.QueryRowContext(ctx, rebind(db, `SELECT COUNT(*) FROM inbox WHERE biz_type = ?`), "none").Scan(&n)
		return n, err
	}
	if _, err := count(5 * time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	if p.accepted.Load() == 0 {
		t.Fatalf("the query did not go through the proxy: %s", p.Stats())
	}

	done := make(chan error, 1)
	go func() { done <- p.Reset(time.Second) }()
	time.Sleep(100 * time.Millisecond)
	if _, err := count(5 * time.Second); err == nil {
		t.Fatal("a query in a reset window worked")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := count(5 * time.Second); err != nil {
		t.Fatalf("after the reset window: %v", err)
	}

	if err := p.SetCut(true); err != nil {
		t.Fatal(err)
	}
	if _, err := count(time.Second); err == nil {
		t.Fatal("a query during a cut worked")
	}
	p.Heal()
	if _, err := count(5 * time.Second); err != nil {
		t.Fatalf("after healing the cut: %v", err)
	}
}

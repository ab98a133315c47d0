package main

import (
	"bufio"
	"net"
	"testing"
	"time"
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

func roundTrip(c net.Conn) (time.Duration, error) {
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := bufio.NewReader(c).ReadString('\n')
	return time.Since(start), err
}

func TestProxyLatencyResetCut(t *testing.T) {
	p, err := newProxy("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := roundTrip(c); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.SetLatency(50 * time.Millisecond)
	if d, err := roundTrip(c); err != nil || d < 100*time.Millisecond {
		t.Fatalf("latency: round trip %s (want ≥ 100ms: 50ms each way), %v", d, err)
	}
	p.SetLatency(0)
	if n := p.ResetAll(); n != 2 {
		t.Fatalf("reset %d connections, want 2 (client and upstream side)", n)
	}
	if _, err := roundTrip(c); err == nil {
		t.Fatal("a reset connection still works")
	}
	p.SetCut(true)
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		if _, err := roundTrip(c2); err == nil {
			t.Fatal("a connection works during a cut")
		}
		c2.Close()
	}
	p.Heal()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := roundTrip(c3); err != nil {
		t.Fatalf("after healing: %v", err)
	}
}

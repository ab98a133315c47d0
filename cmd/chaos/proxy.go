package main

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is a small in-process TCP proxy between the routers and one upstream (MariaDB).
// github.com/Shopify/toxiproxy/v2 resolves through the Go proxy, but using it would mean
// changing go.mod/go.sum (not this harness's to change) and pulling in its HTTP API
// dependencies; the three faults the harness needs fit in this file:
//
//   - latency: every chunk forwarded in either direction waits this long first;
//   - reset: every open connection is closed with SO_LINGER 0 (the peer sees a RST);
//   - cut: reset, and every new connection is reset at once until the cut heals.
type proxy struct {
	ln       net.Listener
	upstream string

	latency atomic.Int64 // nanoseconds
	cut     atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	accepted, resets atomic.Int64
	wg               sync.WaitGroup
}

func newProxy(listen, upstream string) (*proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every forwarded chunk by d (0 heals).
func (p *proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// SetCut refuses (resets) new connections while on; turning it on resets the open ones.
func (p *proxy) SetCut(on bool) {
	p.cut.Store(on)
	if on {
		p.ResetAll()
	}
}

// ResetAll resets every open connection (both sides).
func (p *proxy) ResetAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		resetConn(c)
		delete(p.conns, c)
		n++
	}
	p.resets.Add(int64(n))
	return n
}

// Heal removes every fault.
func (p *proxy) Heal() {
	p.SetLatency(0)
	p.cut.Store(false)
}

// Close stops listening and resets every connection.
func (p *proxy) Close() {
	_ = p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			resetConn(c)
			continue
		}
		p.accepted.Add(1)
		go p.handle(c)
	}
}

func (p *proxy) handle(client net.Conn) {
	up, err := net.DialTimeout("tcp", p.upstream, 3*time.Second)
	if err != nil {
		resetConn(client)
		return
	}
	p.track(client)
	p.track(up)
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, client); done <- struct{}{} }()
	go func() { p.pipe(client, up); done <- struct{}{} }()
	<-done
	// One direction ended (EOF, error or reset): end the other one too.
	_ = client.Close()
	_ = up.Close()
	<-done
	p.untrack(client)
	p.untrack(up)
}

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.latency.Load()); d > 0 {
				time.Sleep(d)
			}
			if p.cut.Load() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a reset: this direction is over
			return
		}
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// proxy is one in-process toxiproxy (github.com/Shopify/toxiproxy/v2 used as a library, no
// HTTP API) between the routers and one upstream (MariaDB, or Kafka's CHAOS listener), with
// the three faults the harness injects:
//
//   - latency: a latency toxic in both directions (every chunk waits this long);
//   - reset: a reset_peer toxic (timeout 0) in both directions for a window: every
//     connection that carries data in that window is closed with SO_LINGER 0 (the peer sees a
//     RST); Kafka connections carry a fetch or heartbeat at least every second, so a
//     window of a second or more hits all of them;
//   - cut: a timeout toxic (timeout 0) in both directions: the network silently drops
//     everything, new connections are accepted and hear nothing (a partition, not a refusal);
//     when the cut heals, toxiproxy closes every connection that lived through it.
//
// It counts each fault and the connections it accepted (from toxiproxy's own log events).
type proxy struct {
	name string
	tp   *toxiproxy.Proxy

	mu      sync.Mutex // one change of the toxics at a time
	latency time.Duration
	cut     bool

	accepted                   atomic.Int64
	latencies, resets, cutsCnt atomic.Int64
}

// acceptCounter counts toxiproxy's "Accepted client" log events.
type acceptCounter struct{ n *atomic.Int64 }

func (h acceptCounter) Run(_ *zerolog.Event, _ zerolog.Level, msg string) {
	if msg == "Accepted client" {
		h.n.Add(1)
	}
}

func newProxy(name, listen, upstream string) (*proxy, error) {
	p := &proxy{name: name}
	logger := zerolog.New(io.Discard).Level(zerolog.InfoLevel).Hook(acceptCounter{&p.accepted})
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
	p.tp = toxiproxy.NewProxy(srv, name, listen, upstream)
	if err := p.tp.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s on %s: %w", name, listen, err)
	}
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *proxy) Addr() string {
	p.tp.Lock()
	defer p.tp.Unlock()
	return p.tp.Listen
}

func (p *proxy) addToxic(name, typ, stream string, attrs string) error {
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1.0,"attributes":%s}`, name, typ, stream, attrs)
	_, err := p.tp.Toxics.AddToxicJson(strings.NewReader(js))
	return err
}

func (p *proxy) removeToxic(name string) {
	_ = p.tp.Toxics.RemoveToxic(context.Background(), name)
}

// both adds a toxic of typ in both directions (names name-up and name-down).
func (p *proxy) both(name, typ, attrs string) error {
	if err := p.addToxic(name+"-up", typ, "upstream", attrs); err != nil {
		return err
	}
	if err := p.addToxic(name+"-down", typ, "downstream", attrs); err != nil {
		p.removeToxic(name + "-up")
		return err
	}
	return nil
}

func (p *proxy) removeBoth(name string) {
	p.removeToxic(name + "-up")
	p.removeToxic(name + "-down")
}

// SetLatency delays every forwarded chunk by d in each direction (0 heals).
func (p *proxy) SetLatency(d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latency > 0 {
		p.removeBoth("latency")
		p.latency = 0
	}
	if d <= 0 {
		return nil
	}
	if err := p.both("latency", "latency", fmt.Sprintf(`{"latency":%d,"jitter":0}`, d.Milliseconds())); err != nil {
		return err
	}
	p.latency = d
	p.latencies.Add(1)
	return nil
}

// Reset resets (RST) every connection that carries data during window.
func (p *proxy) Reset(window time.Duration) error {
	p.mu.Lock()
	err := p.both("reset", "reset_peer", `{"timeout":0}`)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	p.resets.Add(1)
	time.Sleep(window)
	p.mu.Lock()
	p.removeBoth("reset")
	p.mu.Unlock()
	return nil
}

// SetCut drops all traffic while on; turning it off closes every connection that lived
// through the cut.
func (p *proxy) SetCut(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.cut {
		return nil
	}
	if !on {
		p.removeBoth("cut")
		p.cut = false
		return nil
	}
	if err := p.both("cut", "timeout", `{"timeout":0}`); err != nil {
		return err
	}
	p.cut = true
	p.cutsCnt.Add(1)
	return nil
}

// Heal removes every fault.
func (p *proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tp.Toxics.ResetToxics(context.Background())
	p.latency, p.cut = 0, false
}

// Stats is "connections=N latency=L resets=R cuts=C" (fault episodes).
func (p *proxy) Stats() string {
	return fmt.Sprintf("connections=%d latency=%d resets=%d cuts=%d", p.accepted.Load(), p.latencies.Load(), p.resets.Load(), p.cutsCnt.Load())
}

// Close heals, stops listening and closes every connection.
func (p *proxy) Close() {
	p.Heal()
	p.tp.Stop()
}

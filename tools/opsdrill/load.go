package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"
)

// segmentSeconds is how long one `router produce` of the steady load runs. The load is a
// chain of such segments, each with its own ledger, so that a segment ends at most this
// long after the load is asked to stop.
const segmentSeconds = 30

// segment is one `router produce` run of the steady load.
type segment struct {
	n      int
	start  time.Time
	ledger string
	err    error
}

// load sends orders at a steady rate: `router produce` segments, one after the other, until
// stopped.
type load struct {
	d    *drill
	rate int

	mu       sync.Mutex
	segments []segment
	cancel   context.CancelFunc
	done     chan struct{}
	next     int
}

// start begins a chain of segments. It returns at once.
func (l *load) start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	l.mu.Lock()
	l.cancel, l.done = cancel, done
	l.mu.Unlock()
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			l.mu.Lock()
			n := l.next
			l.next++
			l.mu.Unlock()
			s := segment{n: n, start: time.Now(), ledger: filepath.Join(l.d.dir, fmt.Sprintf("ledger-%03d.txt", n))}
			// --dup-rate 0.1: a tenth of the orders arrive twice; --rate counts messages.
			orders := l.rate * segmentSeconds * 10 / 11
			_, s.err = runCmd(context.WithoutCancel(ctx), l.d.env(), l.d.router, "--config", l.d.cfg, "produce",
				"--orders", fmt.Sprint(orders), "--dup-rate", "0.1", "--rate", fmt.Sprint(l.rate), "--batch", "20",
				"--prefix", fmt.Sprintf("%s-%03d", l.d.prefix, n), "--seed", fmt.Sprint(n+1), "--ledger", s.ledger)
			l.mu.Lock()
			l.segments = append(l.segments, s)
			l.mu.Unlock()
			if s.err != nil {
				l.d.logf("load: segment %d: %v", n, s.err)
				return
			}
		}
	}()
}

// stop waits for the running segment to end and starts no other.
func (l *load) stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// ledgers returns the segments' ledgers, and an error when one of the segments failed.
func (l *load) ledgers() ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.segments {
		if s.err != nil {
			return nil, fmt.Errorf("load segment %d: %w", s.n, s.err)
		}
		out = append(out, s.ledger)
	}
	return out, nil
}

package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// simulatedCalls are the slow outside calls of the seed loads: each call sleeps delay plus
// up to jitter, as the coupon plugin's step_delay and step_jitter settings make its own
// calls, and none fails. It has no Instant method, so a granter calling it is a Preparer.
type simulatedCalls struct {
	delay, jitter time.Duration

	mu  sync.Mutex
	rng *rand.Rand
}

// newSimulatedCalls builds simulatedCalls seeded with seed.
func newSimulatedCalls(delay, jitter time.Duration, seed uint64) *simulatedCalls {
	return &simulatedCalls{delay: delay, jitter: jitter, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Call implements coupon.ExternalService.
func (s *simulatedCalls) Call(ctx context.Context, _, _ string) error {
	s.mu.Lock()
	d := s.delay
	if s.jitter > 0 {
		d += time.Duration(s.rng.Int64N(int64(s.jitter)))
	}
	s.mu.Unlock()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

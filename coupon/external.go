package coupon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// ExternalService is the slow downstream each step calls, such as the stock, marketing and
// wallet services. A call may take seconds. Each call carries an idempotency key made of
// the order id and the step, so the downstream recognises a retried call.
type ExternalService interface {
	Call(ctx context.Context, step, idempotencyKey string) error
}

// errInjected is the error of an injected failure.
var errInjected = errors.New("coupon: injected external failure")

// simulatedService simulates slow and flaky calls. Each call sleeps Delay plus up to
// Jitter, and fails with probability FailureRate. With zeros it costs nothing.
type simulatedService struct {
	Delay       time.Duration
	Jitter      time.Duration
	FailureRate float64

	mu  sync.Mutex
	rng *rand.Rand
}

// newSimulatedService builds a seeded simulatedService.
func newSimulatedService(delay, jitter time.Duration, failureRate float64, seed uint64) *simulatedService {
	return &simulatedService{Delay: delay, Jitter: jitter, FailureRate: failureRate, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Instant reports whether a call returns at once. It does when no delay is configured,
// and for a nil service.
func (s *simulatedService) Instant() bool { return s == nil || s.Delay == 0 && s.Jitter == 0 }

// Call implements ExternalService.
func (s *simulatedService) Call(ctx context.Context, step, key string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	d := s.Delay
	if s.Jitter > 0 {
		d += time.Duration(s.rng.Int64N(int64(s.Jitter)))
	}
	fail := s.FailureRate > 0 && s.rng.Float64() < s.FailureRate
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	if fail {
		return fmt.Errorf("%w: %s (%s)", errInjected, step, key)
	}
	return nil
}

// observedService reports every call's duration and error to PluginEnv.ObserveCall.
type observedService struct {
	svc     ExternalService
	observe func(step string, elapsed time.Duration, err error)
}

// Instant reports whether the observed service's calls return at once, as instant does.
func (s observedService) Instant() bool { return instant(s.svc) }

func (s observedService) Call(ctx context.Context, step, key string) error {
	start := time.Now()
	err := s.svc.Call(ctx, step, key)
	s.observe(step, time.Since(start), err)
	return err
}

// instant reports whether svc says its calls return at once, with an Instant method that
// returns true. The plugin's handler then makes the calls in the transaction and needs no
// Preparer. A service that does not say is taken to be slow.
func instant(svc ExternalService) bool {
	i, ok := svc.(interface{ Instant() bool })
	return ok && i.Instant()
}

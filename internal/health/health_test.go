package health_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/health"
)

// start runs a Checker until the test ends.
func start(t *testing.T, cfg health.Config, checks ...health.Check) *health.Checker {
	t.Helper()
	c, err := health.New(cfg, nil, checks...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func get(c *health.Checker) (int, string) {
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code, rec.Body.String()
}

// waitFor polls /readyz until its answer satisfies ok.
func waitFor(t *testing.T, c *health.Checker, what string, ok func(code int, body string) bool) string {
	t.Helper()
	var code int
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if code, body = get(c); ok(code, body) {
			return body
		}
	}
	t.Fatalf("/readyz never %s: last %d %q", what, code, body)
	return ""
}

func TestNewRefusesBadChecks(t *testing.T) {
	f := func(context.Context) error { return nil }
	for name, checks := range map[string][]health.Check{
		"no name":   {{Func: f}},
		"no func":   {{Name: "x"}},
		"duplicate": {{Name: "x", Func: f}, {Name: "x", Func: f}},
	} {
		if _, err := health.New(health.Config{}, nil, checks...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Results come from the background: pending first, then ok, then the failure category
// without the error's text, then ok again.
func TestReadyzFollowsChecks(t *testing.T) {
	var failing atomic.Bool
	release := make(chan struct{})
	c := start(t, health.Config{Interval: 5 * time.Millisecond, Timeout: time.Second},
		health.Check{Name: "db", Func: func(ctx context.Context) error {
			<-release
			if failing.Load() {
				return errors.New("dial tcp 10.1.2.3:3306: connection refused for user secret")
			}
			return nil
		}},
		health.Check{Name: "alpha", Func: func(context.Context) error { return nil }})

	if code, body := get(c); code != http.StatusServiceUnavailable || !strings.Contains(body, "db: pending") {
		t.Fatalf("before the first result: %d %q, want 503 with db pending", code, body)
	}
	close(release)
	body := waitFor(t, c, "ready", func(code int, _ string) bool { return code == http.StatusOK })
	if !strings.HasPrefix(body, "alpha: ok") || !strings.Contains(body, "\ndb: ok") {
		t.Fatalf("ready body %q: want one ok line per check, by name", body)
	}
	failing.Store(true)
	body = waitFor(t, c, "failing", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "db: failed (unreachable)")
	})
	if strings.Contains(body, "10.1.2.3") || strings.Contains(body, "secret") {
		t.Fatalf("/readyz shows the error's text: %q", body)
	}
	failing.Store(false)
	waitFor(t, c, "ready again", func(code int, _ string) bool { return code == http.StatusOK })
}

// A check that hangs until its timeout is reported as a timeout, and is never called again
// while a call is in flight however many requests come.
func TestReadyzHangingCheck(t *testing.T) {
	var inFlight, most, calls atomic.Int32
	c := start(t, health.Config{Interval: time.Millisecond, Timeout: 20 * time.Millisecond},
		health.Check{Name: "kafka", Func: func(ctx context.Context) error {
			calls.Add(1)
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			<-ctx.Done()
			return ctx.Err()
		}})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				get(c)
			}
		}()
	}
	wg.Wait()
	waitFor(t, c, "a timeout", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "kafka: failed (timeout)")
	})
	if m := most.Load(); m != 1 {
		t.Fatalf("%d calls of one check in flight at once, want 1", m)
	}
	t.Logf("%d calls for 400+ requests", calls.Load())
}

// A check that ignores its context and never returns: its last result goes stale, so
// /readyz fails instead of repeating an old ok, and no second call starts.
func TestReadyzStaleResult(t *testing.T) {
	var calls atomic.Int32
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) }) // lets the stuck call, and so Run, return when the test ends
	c, err := health.New(health.Config{Interval: time.Millisecond, Timeout: 10 * time.Millisecond, MaxAge: 50 * time.Millisecond}, nil,
		health.Check{Name: "db", Func: func(context.Context) error {
			if calls.Add(1) > 1 {
				<-stuck
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	waitFor(t, c, "ready", func(code int, _ string) bool { return code == http.StatusOK })
	waitFor(t, c, "stale", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "db: failed (stale)")
	})
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2 (the stuck one blocks the next)", n)
	}
}

// Run returns once its context is done and the checks' calls have returned.
func TestRunStops(t *testing.T) {
	c, err := health.New(health.Config{Interval: time.Hour}, nil,
		health.Check{Name: "x", Func: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

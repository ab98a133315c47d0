// Package health runs readiness checks in the background and serves their latest results.
// So /readyz answers at once whatever the checked services do, even a broker that accepts
// connections and never answers. A flood of requests causes no extra checks.
package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Check is one dependency to check.
type Check struct {
	Name string
	// Func returns nil when the dependency is usable. It must return once ctx is done, and
	// ctx carries Config.Timeout. A call that overruns still blocks the next call of the
	// same check, so two never run at once. Its result then goes stale.
	Func func(ctx context.Context) error
}

// Config tunes a Checker.
type Config struct {
	// Interval is the pause between the end of one call of a check and the start of the
	// next. The default is 5s.
	Interval time.Duration
	// Timeout bounds each call of a check. The default is 3s.
	Timeout time.Duration
	// MaxAge is how old a check's latest result may be and still count. An older result
	// means that the check hangs, and the check counts as failed with the state "stale".
	// The default is 3 × (Interval + Timeout).
	MaxAge time.Duration
}

// WithDefaults returns c with its zero settings set to their defaults, as the checker uses it.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 3 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 3 * (c.Interval + c.Timeout)
	}
}

// Checker runs each check in its own goroutine, one call at a time, and keeps the latest
// result of each with its time.
type Checker struct {
	cfg    Config
	checks []Check
	logger watermill.LoggerAdapter

	mu      sync.RWMutex
	results map[string]result
}

type result struct {
	err error     // nil: ok
	at  time.Time // when the call returned
}

// New builds a Checker. Nothing runs before Run. Check names must be unique and non-empty.
// A nil logger logs nothing.
func New(cfg Config, logger watermill.LoggerAdapter, checks ...Check) (*Checker, error) {
	cfg.setDefaults()
	seen := map[string]bool{}
	for _, c := range checks {
		if c.Name == "" || c.Func == nil {
			return nil, errors.New("health: a check needs a name and a func")
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("health: check %q twice", c.Name)
		}
		seen[c.Name] = true
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Checker{cfg: cfg, checks: slices.Clone(checks), logger: logger, results: map[string]result{}}, nil
}

// Run calls every check at once and then every Interval until ctx is done, and returns
// when every check's current call has returned.
func (c *Checker) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ch := range c.checks {
		wg.Add(1)
		go func() { defer wg.Done(); c.loop(ctx, ch) }()
	}
	wg.Wait()
}

func (c *Checker) loop(ctx context.Context, ch Check) {
	failing := false
	for {
		cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		start := time.Now()
		err := ch.Func(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		c.results[ch.Name] = result{err: err, at: time.Now()}
		c.mu.Unlock()
		// The details go to the log, once per change. /readyz shows only a category.
		fields := watermill.LogFields{"check": ch.Name, "took": time.Since(start).Round(time.Millisecond).String()}
		if err != nil && !failing {
			c.logger.Error("readiness check failed", err, fields.Add(watermill.LogFields{"reason": reason(err)}))
		} else if err == nil && failing {
			c.logger.Info("readiness check ok again", fields)
		}
		failing = err != nil
		t := time.NewTimer(c.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// reason is what /readyz says about a failure. It is a category, and never the error's
// text, which may hold addresses, user names and driver messages.
func reason(err error) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return "unreachable"
}

// Status is one check's state as /readyz reports it.
type Status struct {
	Name  string
	OK    bool
	State string    // ok, pending (no result yet), failed (timeout|unreachable|stale)
	At    time.Time // when the latest result came in; zero while pending
}

// Statuses returns every check's state, by name, and whether all are ok.
func (c *Checker) Statuses() ([]Status, bool) {
	now := time.Now()
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Status, 0, len(c.checks))
	ready := true
	for _, ch := range c.checks {
		st := Status{Name: ch.Name}
		r, ok := c.results[ch.Name]
		switch {
		case !ok:
			st.State = "pending"
		case now.Sub(r.at) > c.cfg.MaxAge:
			st.State, st.At = "failed (stale)", r.at
		case r.err != nil:
			st.State, st.At = "failed ("+reason(r.err)+")", r.at
		default:
			st.OK, st.State, st.At = true, "ok", r.at
		}
		ready = ready && st.OK
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out, ready
}

// ServeHTTP answers from the latest results. The status is 200 when every check is ok,
// and 503 otherwise. The body has one line per check, such as the following.
//
//	name: state (checked 1.2s ago)
func (c *Checker) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	sts, ready := c.Statuses()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if ready {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	now := time.Now()
	for _, st := range sts {
		if st.At.IsZero() {
			fmt.Fprintf(w, "%s: %s\n", st.Name, st.State)
		} else {
			fmt.Fprintf(w, "%s: %s (checked %s ago)\n", st.Name, st.State, now.Sub(st.At).Round(100*time.Millisecond))
		}
	}
}

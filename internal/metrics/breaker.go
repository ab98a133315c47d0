package metrics

import (
	"sort"
	"sync"
	"time"
)

// BreakerSummary is a plugin's circuit breaker as this process last saw it, for the console.
type BreakerSummary struct {
	BizType string
	State   int       // 0 closed, 1 open, 2 half-open (onceflow_inbox_breaker_state)
	Since   time.Time // zero: closed since the start
	ProbeAt time.Time // open: when a probe may run
	// LastError is the error of the last failed attempt the breaker counted, or "" for none.
	LastError string
}

type breakers struct {
	mu sync.Mutex
	by map[string]BreakerSummary
}

// SetBreaker records a change of biz type's breaker. It sets the gauge and what the console
// shows, the last error the breaker counted included. Entering state 1 adds to the opens
// counter.
func (m *Metrics) SetBreaker(biz string, state int, since, probeAt time.Time, lastError string) {
	m.BreakerState.WithLabelValues(biz).Set(float64(state))
	if state == 1 {
		m.BreakerOpens.WithLabelValues(biz).Inc()
	}
	m.breakers.mu.Lock()
	defer m.breakers.mu.Unlock()
	if m.breakers.by == nil {
		m.breakers.by = map[string]BreakerSummary{}
	}
	m.breakers.by[biz] = BreakerSummary{BizType: biz, State: state, Since: since, ProbeAt: probeAt, LastError: lastError}
}

// Breakers returns the breakers that SetBreaker recorded, by biz type.
func (m *Metrics) Breakers() []BreakerSummary {
	m.breakers.mu.Lock()
	defer m.breakers.mu.Unlock()
	out := make([]BreakerSummary, 0, len(m.breakers.by))
	for _, b := range m.breakers.by {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].BizType < out[j].BizType })
	return out
}

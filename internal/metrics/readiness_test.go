package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/health"
)

// onceflow_ready is 1 per check that is ok and 0 per check that fails or is pending, read
// at scrape time; onceflow_relay_lag_bound_seconds is relay.lag_bound.
func TestReadinessAndLagBound(t *testing.T) {
	for _, tc := range []struct {
		name     string
		statuses []health.Status
		want     []string
	}{
		{"all ok", []health.Status{{Name: "database", OK: true}, {Name: "kafka", OK: true}},
			[]string{`onceflow_ready{check="database"} 1`, `onceflow_ready{check="kafka"} 1`}},
		{"kafka failing", []health.Status{{Name: "database", OK: true}, {Name: "kafka", State: "failed (timeout)"}},
			[]string{`onceflow_ready{check="database"} 1`, `onceflow_ready{check="kafka"} 0`}},
		{"pending", []health.Status{{Name: "database", State: "pending"}},
			[]string{`onceflow_ready{check="database"} 0`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(nil)
			sts := []health.Status{}
			m.AddReadiness(func() []health.Status { return sts })
			m.AddLagBound(90 * time.Second)
			sts = tc.statuses // read at scrape time, not at AddReadiness
			rec := httptest.NewRecorder()
			m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			body := rec.Body.String()
			for _, want := range append(tc.want, "onceflow_relay_lag_bound_seconds 90") {
				if !strings.Contains(body, want+"\n") {
					t.Errorf("/metrics has no line %s", want)
				}
			}
		})
	}
}

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/health"
)

// AddReadiness exports onceflow_ready{check} for each /readyz check. The value is 1 while the
// check is ok. It is 0 while the check fails, has gone stale or has no result yet. statuses
// is read at scrape time and gives the checks' latest results, so a scrape runs no check.
func (m *Metrics) AddReadiness(statuses func() []health.Status) {
	m.Registry.MustRegister(&readiness{statuses: statuses,
		desc: prometheus.NewDesc("onceflow_ready",
			"1 while the /readyz check (database, kafka) is ok; 0 while it fails, is stale or has no result yet.",
			[]string{"check"}, nil)})
}

type readiness struct {
	statuses func() []health.Status
	desc     *prometheus.Desc
}

func (r *readiness) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r *readiness) Collect(ch chan<- prometheus.Metric) {
	for _, st := range r.statuses() {
		v := 0.0
		if st.OK {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, v, st.Name)
	}
}

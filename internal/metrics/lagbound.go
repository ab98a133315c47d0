package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AddLagBound exports relay.lag_bound as onceflow_relay_lag_bound_seconds. It is the age an
// unpublished outbox row must not reach, and router verify calls an older one a violation.
// An alert compares onceflow_outbox_oldest_unpublished_seconds with it.
func (m *Metrics) AddLagBound(d time.Duration) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "onceflow", Name: "relay_lag_bound_seconds",
		Help: "relay.lag_bound: an outbox row unpublished for longer is a violation (router verify)."})
	g.Set(d.Seconds())
	m.Registry.MustRegister(g)
}

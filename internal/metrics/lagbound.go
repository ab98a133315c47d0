package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AddLagBound exports onceflow_relay_lag_bound_seconds, relay.lag_bound: the age an
// unpublished outbox row must not reach (router verify calls an older one a violation), for
// an alert to compare onceflow_outbox_oldest_unpublished_seconds with.
func (m *Metrics) AddLagBound(d time.Duration) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "onceflow", Name: "relay_lag_bound_seconds",
		Help: "relay.lag_bound: an outbox row unpublished for longer is a violation (router verify)."})
	g.Set(d.Seconds())
	m.Registry.MustRegister(g)
}

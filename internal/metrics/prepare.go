package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The collectors of slow outside calls count the deliveries being prepared, whose calls are
// in flight. They time each preparation and each call.

// PrepareStats reports a Batcher's deliveries being prepared now, from engine.Batcher.Stats.
type PrepareStats func() int64

// AddPreparing registers the gauge onceflow_inbox_prepares_in_flight for bizType.
func (m *Metrics) AddPreparing(bizType string, running PrepareStats) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "onceflow", Name: "inbox_prepares_in_flight",
		Help:        "Deliveries whose outside calls (the plugin's Prepare) are running now; at most inbox.max_in_flight_calls.",
		ConstLabels: prometheus.Labels{"biz_type": bizType}}, func() float64 { return float64(running()) }))
}

// ObservePrepare records one preparation of a delivery, with all its calls.
func (m *Metrics) ObservePrepare(bizType string, elapsed time.Duration, err error) {
	m.PrepareSeconds.WithLabelValues(bizType, outcome(err)).Observe(elapsed.Seconds())
}

// ObserveCall records one outside call of a plugin's step.
func (m *Metrics) ObserveCall(plugin, step string, elapsed time.Duration, err error) {
	m.CallSeconds.WithLabelValues(plugin, step, outcome(err)).Observe(elapsed.Seconds())
}

func outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// callBuckets span the seed plugin's calls of 0.8 to 2 s each, and fast ones. They go from
// 1 ms to about 33 s.
var callBuckets = prometheus.ExponentialBuckets(0.001, 2, 16)

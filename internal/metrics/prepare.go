package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Slow outside calls: how many deliveries are being prepared (their calls in flight), how
// long a preparation and each call take.

// PrepareStats reports a Batcher's deliveries being prepared now (inbox.Batcher.Stats).
type PrepareStats func() int64

// AddPreparing registers the gauge onceflow_inbox_prepares_in_flight for bizType.
func (m *Metrics) AddPreparing(bizType string, running PrepareStats) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "onceflow", Name: "inbox_prepares_in_flight",
		Help:        "Deliveries whose outside calls (the plugin's Prepare) are running now; at most inbox.max_in_flight_calls.",
		ConstLabels: prometheus.Labels{"biz_type": bizType}}, func() float64 { return float64(running()) }))
}

// ObservePrepare records one preparation of a delivery (all its calls).
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

// callBuckets span the seed's calls (0.8–2 s each) and fast ones: 1 ms to ≈33 s.
var callBuckets = prometheus.ExponentialBuckets(0.001, 2, 16)

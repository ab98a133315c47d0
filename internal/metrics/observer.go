package metrics

import (
	"time"
)

// Observe records one delivery.
func (m *Metrics) Observe(bizType, outcome string, elapsed time.Duration) {
	m.Deliveries.WithLabelValues(bizType, outcome).Inc()
	m.HandlerSeconds.WithLabelValues(bizType, outcome).Observe(elapsed.Seconds())
	m.throughput.add(outcome, time.Now())
}

package metrics

import (
	"time"
)

// Observe records one delivery in the collectors and the totals since the start. With a
// database, it also records it in the history that a router adds to HistoryTable.
func (m *Metrics) Observe(bizType, outcome string, elapsed time.Duration) {
	m.Deliveries.WithLabelValues(bizType, outcome).Inc()
	m.HandlerSeconds.WithLabelValues(bizType, outcome).Observe(elapsed.Seconds())
	m.throughput.add(outcome)
	if m.history != nil && outcomeIndex(outcome) >= 0 {
		m.history.add(bizType, outcome, time.Now())
	}
}

// InitBizType creates biz type's counters at zero for every outcome. So a rate or an
// increase over them, in an alert or a dashboard panel, has a series before the first
// delivery of that outcome.
func (m *Metrics) InitBizType(bizType string, outcomes, redeliveryOutcomes []string) {
	for _, o := range outcomes {
		m.Deliveries.WithLabelValues(bizType, o)
	}
	for _, o := range redeliveryOutcomes {
		m.Redeliveries.WithLabelValues(bizType, o)
	}
	m.BreakerOpens.WithLabelValues(bizType)
}

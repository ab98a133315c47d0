package metrics

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// PartitionStatsSource is a consumer that reports the partitions it has claimed, as
// kafkax.ParallelSubscriber does. watermill-kafka's subscriber (kafka.window 1) reports
// nothing of the kind and so is not a source.
type PartitionStatsSource interface {
	PartitionStats() []kafkax.PartitionStat
}

// ConsumerCollector exports, per consumer group, topic and partition claimed by this
// process, the committed lag, the messages in flight and the age of the oldest un-acked
// one. It reads its sources at scrape time, so a partition shows only while its claim
// lasts: after a rebalance the partitions this process gave up have no series here (their
// new owner reports them).
type ConsumerCollector struct {
	mu      sync.Mutex
	sources []PartitionStatsSource

	lag, oldest, inFlight *prometheus.Desc
}

var _ prometheus.Collector = (*ConsumerCollector)(nil)

// NewConsumerCollector returns a collector with no sources.
func NewConsumerCollector() *ConsumerCollector {
	labels := []string{"group", "topic", "partition"}
	const only = " Reported by the parallel subscriber (kafka.window > 1) for the partitions this process has claimed; nothing with kafka.window 1."
	return &ConsumerCollector{
		lag: prometheus.NewDesc("onceflow_consumer_lag_messages",
			"Offsets in the partition past the offset committed (marked) for the group: high water mark minus marked offset."+
				" Absent before a new group's first message of the partition; 1 or more at rest on a topic written in Kafka transactions (commit markers take offsets)."+only,
			labels, nil),
		oldest: prometheus.NewDesc("onceflow_consumer_oldest_unacked_seconds",
			"Age of the partition's oldest delivery not acked yet, from its first hand-out (nacks do not reset it); 0 when none is in flight."+only,
			labels, nil),
		inFlight: prometheus.NewDesc("onceflow_consumer_in_flight",
			"Deliveries of the partition handed out and not acked yet (at most kafka.window)."+only,
			labels, nil),
	}
}

// Add makes src's partitions part of every scrape from now on.
func (c *ConsumerCollector) Add(src PartitionStatsSource) {
	c.mu.Lock()
	c.sources = append(c.sources, src)
	c.mu.Unlock()
}

func (c *ConsumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.oldest
	ch <- c.inFlight
}

type partitionKey struct {
	group, topic string
	partition    int32
}

// Collect emits one series per group, topic and partition. Two claims of the same
// partition in this process (two subscribers of one group and topic, for the moment one
// hands it to the other) make one series: the larger lag and age, the sum in flight.
func (c *ConsumerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := append([]PartitionStatsSource(nil), c.sources...)
	c.mu.Unlock()
	type agg struct {
		lag      int64
		lagKnown bool
		oldest   float64
		inFlight int
	}
	var order []partitionKey
	byKey := map[partitionKey]*agg{}
	for _, src := range sources {
		for _, st := range src.PartitionStats() {
			k := partitionKey{st.Group, st.Topic, st.Partition}
			a := byKey[k]
			if a == nil {
				a = &agg{}
				byKey[k] = a
				order = append(order, k)
			}
			if lag, ok := st.Lag(); ok {
				a.lag, a.lagKnown = max(a.lag, lag), true
			}
			a.oldest = max(a.oldest, st.OldestUnackedAge.Seconds())
			a.inFlight += st.InFlight
		}
	}
	for _, k := range order {
		a := byKey[k]
		lv := []string{k.group, k.topic, strconv.FormatInt(int64(k.partition), 10)}
		if a.lagKnown {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(a.lag), lv...)
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, a.oldest, lv...)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(a.inFlight), lv...)
	}
}

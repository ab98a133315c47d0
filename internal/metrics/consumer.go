package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// PartitionStatsSource is a consumer that reports the partitions it has claimed, as
// kafkax.ParallelSubscriber does. watermill-kafka's subscriber, used with kafka.window 1,
// reports nothing of the kind and so is not a source.
type PartitionStatsSource interface {
	PartitionStats() []kafkax.PartitionStat
}

// ConsumerCollector exports the committed lag, the messages in flight and the age of the
// oldest un-acked one. It exports them per consumer group, topic and partition claimed by
// this process. It reads its sources at scrape time, so a partition shows only while its
// claim lasts. After a rebalance, the partitions this process gave up have no series here.
// Their new owner reports them.
type ConsumerCollector struct {
	mu      sync.Mutex
	sources []PartitionStatsSource
	lags    LagJudge // nil: the offsets' difference as it is

	lag, oldest, inFlight, inFlightBytes, skipped *prometheus.Desc
}

// skippedSource is a source that counts the messages it did not hand out again because an
// earlier claim of their partition acked them, as kafkax.ParallelSubscriber does.
type skippedSource interface {
	SkippedAcked() int64
}

var _ prometheus.Collector = (*ConsumerCollector)(nil)

// NewConsumerCollector returns a collector with no sources.
func NewConsumerCollector() *ConsumerCollector {
	labels := []string{"group", "topic", "partition"}
	const only = " Reported by the parallel subscriber (kafka.window > 1) for the partitions this process has claimed; nothing with kafka.window 1."
	return &ConsumerCollector{
		lag: prometheus.NewDesc("onceflow_consumer_lag_messages",
			"Offsets in the partition past the offset committed (marked) for the group: high water mark minus marked offset,"+
				" 0 when they hold only transaction markers or aborted records (a read_committed fetch finds no record). Absent before a new group's first message of the partition."+only,
			labels, nil),
		oldest: prometheus.NewDesc("onceflow_consumer_oldest_unacked_seconds",
			"Age of the partition's oldest delivery not acked yet, from its first hand-out (nacks do not reset it); 0 when none is in flight."+only,
			labels, nil),
		inFlight: prometheus.NewDesc("onceflow_consumer_in_flight",
			"Deliveries of the partition handed out and not acked yet (at most kafka.window)."+only,
			labels, nil),
		inFlightBytes: prometheus.NewDesc("onceflow_consumer_in_flight_bytes",
			"What the partition's deliveries in flight cost the router's kafka.max_in_flight_bytes budget: their values (cut ones as cut), keys and headers, plus a fixed overhead each."+only,
			labels, nil),
		skipped: prometheus.NewDesc("onceflow_consumer_acked_skipped_total",
			"Messages not handed out again after a rebalance or a restart because the partition's earlier claim acked them past its committed offset"+
				" (listed in the offset commit's metadata): copies the inbox did not have to turn away."+only,
			nil, nil),
	}
}

// LagJudge tells the lag a consumer would see, as kafkax.LagReader does. The lag is end -
// committed, or 0 when only transaction markers lie between them.
type LagJudge interface {
	Lag(topic string, partition int32, committed, end int64) (int64, error)
}

// JudgeLag makes the lag of every partition the one j tells from now on. So a partition
// caught up on a transactional topic reads 0, because its commit markers are not waiting
// records.
func (c *ConsumerCollector) JudgeLag(j LagJudge) {
	c.mu.Lock()
	c.lags = j
	c.mu.Unlock()
}

// Judge returns the LagJudge set by JudgeLag, or nil for none.
func (c *ConsumerCollector) Judge() LagJudge {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lags
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
	ch <- c.inFlightBytes
	ch <- c.skipped
}

// PartitionSummary is one partition claimed by this process, as the collector exports it.
type PartitionSummary struct {
	Group     string
	Topic     string
	Partition int32
	// Lag is the committed lag, the high water mark minus the marked offset. It is 0 when
	// only transaction markers lie between them. LagKnown is false before a new group's
	// first message of the partition.
	Lag      int64
	LagKnown bool
	// OldestUnacked is the age of the oldest delivery not acked yet, or 0 when none.
	OldestUnacked time.Duration
	InFlight      int
	InFlightBytes int64
}

// Partitions returns the partitions claimed now, in the order the sources report them.
// This process may hold two claims of the same partition for a moment. That happens when
// two subscribers of one group and topic hand the partition over. The two claims make one
// entry, with the larger lag and age and the sum in flight.
func (c *ConsumerCollector) Partitions() []PartitionSummary {
	c.mu.Lock()
	sources := append([]PartitionStatsSource(nil), c.sources...)
	judge := c.lags
	c.mu.Unlock()
	type partitionKey struct {
		group, topic string
		partition    int32
	}
	var out []PartitionSummary
	index := map[partitionKey]int{}
	for _, src := range sources {
		for _, st := range src.PartitionStats() {
			k := partitionKey{st.Group, st.Topic, st.Partition}
			i, ok := index[k]
			if !ok {
				i = len(out)
				index[k] = i
				out = append(out, PartitionSummary{Group: st.Group, Topic: st.Topic, Partition: st.Partition})
			}
			a := &out[i]
			if lag, ok := st.Lag(); ok {
				if lag > 0 && judge != nil {
					lag, _ = judge.Lag(st.Topic, st.Partition, st.Marked, st.HighWater) // an error: lag as it was
				}
				a.Lag, a.LagKnown = max(a.Lag, lag), true
			}
			a.OldestUnacked = max(a.OldestUnacked, st.OldestUnackedAge)
			a.InFlight += st.InFlight
			a.InFlightBytes += st.InFlightBytes
		}
	}
	return out
}

// Collect emits one series per group, topic and partition. See Partitions.
func (c *ConsumerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.Partitions() {
		lv := []string{p.Group, p.Topic, strconv.FormatInt(int64(p.Partition), 10)}
		if p.LagKnown {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(p.Lag), lv...)
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, p.OldestUnacked.Seconds(), lv...)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(p.InFlight), lv...)
		ch <- prometheus.MustNewConstMetric(c.inFlightBytes, prometheus.GaugeValue, float64(p.InFlightBytes), lv...)
	}
	c.mu.Lock()
	var skipped int64
	counted := false
	for _, src := range c.sources {
		if s, ok := src.(skippedSource); ok {
			skipped, counted = skipped+s.SkippedAcked(), true
		}
	}
	c.mu.Unlock()
	if counted {
		ch <- prometheus.MustNewConstMetric(c.skipped, prometheus.CounterValue, float64(skipped))
	}
}

package metrics_test

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// fakeSource reports whatever partitions the test sets.
type fakeSource struct {
	mu sync.Mutex
	st []kafkax.PartitionStat
}

func (f *fakeSource) set(st ...kafkax.PartitionStat) {
	f.mu.Lock()
	f.st = st
	f.mu.Unlock()
}

func (f *fakeSource) PartitionStats() []kafkax.PartitionStat {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]kafkax.PartitionStat(nil), f.st...)
}

var _ metrics.PartitionStatsSource = (*kafkax.ParallelSubscriber)(nil)

// series renders the collector's samples as "name{labels} value" lines, help text aside.
func series(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "onceflow_consumer_") {
			continue
		}
		for _, s := range mf.GetMetric() {
			b.WriteString(mf.GetName() + "{")
			for i, l := range s.GetLabel() {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString(l.GetName() + "=" + l.GetValue())
			}
			b.WriteString("} " + strconv.FormatFloat(s.GetGauge().GetValue(), 'g', -1, 64) + "\n")
		}
	}
	return b.String()
}

func TestConsumerCollector(t *testing.T) {
	m := metrics.New(nil)
	a, b := &fakeSource{}, &fakeSource{}
	m.Consumers.Add(a)
	m.Consumers.Add(b)
	if got := series(t, m); got != "" {
		t.Fatalf("no partitions claimed, got series:\n%s", got)
	}

	a.set(
		kafkax.PartitionStat{Group: "g", Topic: "t", Partition: 0, HighWater: 120, Marked: 100, InFlight: 3, InFlightBytes: 12000, OldestUnackedAge: 1500 * time.Millisecond},
		kafkax.PartitionStat{Group: "g", Topic: "t", Partition: 1, HighWater: 50, Marked: 50},
		kafkax.PartitionStat{Group: "g", Topic: "t", Partition: 2, HighWater: 7, Marked: -1}, // a new group, nothing fetched yet
	)
	// b holds partition 0 too for a moment (a hand-over inside this process): one series.
	b.set(kafkax.PartitionStat{Group: "g", Topic: "t", Partition: 0, HighWater: 120, Marked: 90, InFlight: 2, InFlightBytes: 9000, OldestUnackedAge: 4 * time.Second})
	want := `onceflow_consumer_in_flight{group=g,partition=0,topic=t} 5
onceflow_consumer_in_flight{group=g,partition=1,topic=t} 0
onceflow_consumer_in_flight{group=g,partition=2,topic=t} 0
onceflow_consumer_in_flight_bytes{group=g,partition=0,topic=t} 21000
onceflow_consumer_in_flight_bytes{group=g,partition=1,topic=t} 0
onceflow_consumer_in_flight_bytes{group=g,partition=2,topic=t} 0
onceflow_consumer_lag_messages{group=g,partition=0,topic=t} 30
onceflow_consumer_lag_messages{group=g,partition=1,topic=t} 0
onceflow_consumer_oldest_unacked_seconds{group=g,partition=0,topic=t} 4
onceflow_consumer_oldest_unacked_seconds{group=g,partition=1,topic=t} 0
onceflow_consumer_oldest_unacked_seconds{group=g,partition=2,topic=t} 0
`
	if got := series(t, m); got != want {
		t.Fatalf("series:\n%s\nwant:\n%s", got, want)
	}

	// A rebalance took partitions 0 and 2 away: their series go with them.
	a.set(kafkax.PartitionStat{Group: "g", Topic: "t", Partition: 1, HighWater: 60, Marked: 55, InFlight: 5, InFlightBytes: 20480, OldestUnackedAge: 250 * time.Millisecond})
	b.set()
	want = `onceflow_consumer_in_flight{group=g,partition=1,topic=t} 5
onceflow_consumer_in_flight_bytes{group=g,partition=1,topic=t} 20480
onceflow_consumer_lag_messages{group=g,partition=1,topic=t} 5
onceflow_consumer_oldest_unacked_seconds{group=g,partition=1,topic=t} 0.25
`
	if got := series(t, m); got != want {
		t.Fatalf("after the rebalance, series:\n%s\nwant:\n%s", got, want)
	}
}

// skippingSource is a source that counts messages not handed out again.
type skippingSource struct {
	fakeSource
	n int64
}

func (s *skippingSource) SkippedAcked() int64 { return s.n }

func TestConsumerCollectorSkippedAcked(t *testing.T) {
	m := metrics.New(nil)
	m.Consumers.Add(&skippingSource{n: 7})
	m.Consumers.Add(&skippingSource{n: 5})
	m.Consumers.Add(&fakeSource{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Consumers)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "onceflow_consumer_acked_skipped_total" {
			if got := mf.GetMetric()[0].GetCounter().GetValue(); got != 12 {
				t.Fatalf("onceflow_consumer_acked_skipped_total %v, want 12, the sum of the sources that count", got)
			}
			return
		}
	}
	t.Fatal("no onceflow_consumer_acked_skipped_total")
}

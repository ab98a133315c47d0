package kafkax_test

import (
	"testing"

	"github.com/rcrowley/go-metrics"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Every Sarama config of kafkax keeps no metrics, and the registry hands out go-metrics'
// no-ops for the kinds Sarama registers (it would otherwise fail its type assertions).
func TestConfigsKeepNoSaramaMetrics(t *testing.T) {
	c := kafkax.Config{Brokers: []string{"127.0.0.1:9092"}}
	c = c.WithDefaults()
	for name, sc := range map[string]any{
		"consumer":  c.ConsumerConfig().MetricRegistry,
		"producer":  c.ProducerConfig().MetricRegistry,
		"publisher": c.PublisherConfig().MetricRegistry,
	} {
		if sc != kafkax.NoMetrics {
			t.Errorf("%s config: metric registry %T, want kafkax.NoMetrics", name, sc)
		}
	}
	r := kafkax.NoMetrics
	if _, ok := metrics.GetOrRegisterMeter("m", r).(metrics.NilMeter); !ok {
		t.Error("meter is not a no-op")
	}
	if _, ok := metrics.GetOrRegisterCounter("c", r).(metrics.NilCounter); !ok {
		t.Error("counter is not a no-op")
	}
	if _, ok := metrics.GetOrRegisterGauge("g", r).(metrics.NilGauge); !ok {
		t.Error("gauge is not a no-op")
	}
	h := r.GetOrRegister("h", func() metrics.Histogram { return metrics.NewHistogram(metrics.NewUniformSample(10)) })
	if _, ok := h.(metrics.NilHistogram); !ok {
		t.Errorf("histogram is %T, not a no-op", h)
	}
	if v := r.GetOrRegister("other", func() int { return 7 }); v != 7 {
		t.Errorf("another constructor's metric: got %v, want 7", v)
	}
	if r.Get("m") != nil {
		t.Error("NoMetrics kept a metric")
	}
}

package kafkax

import (
	"reflect"

	"github.com/rcrowley/go-metrics"
)

// NoMetrics is the go-metrics registry of every Sarama config built in this package. It
// keeps nothing. Every meter, histogram, counter or gauge that Sarama asks it for is
// go-metrics' no-op of that kind. Otherwise Sarama updates several meters and exponentially
// decaying histograms, each behind a lock, on every request and per topic. Nothing reads
// those numbers, because onceflow exports its own Prometheus metrics. See docs/BENCHMARKS.md,
// section "Sarama keeps no metrics". go-metrics' own switch, metrics.UseNilMetrics, is
// global to the process, while NoMetrics is per config. To inspect Sarama's metrics, set
// config.MetricRegistry = metrics.NewRegistry() on the config before use.
var NoMetrics metrics.Registry = noMetrics{}

type noMetrics struct{}

func (noMetrics) Each(func(string, any))                 {}
func (noMetrics) Get(string) any                         { return nil }
func (noMetrics) GetAll() map[string]map[string]any      { return nil }
func (noMetrics) GetOrRegister(_ string, metric any) any { return nilMetric(metric) }
func (noMetrics) Register(string, any) error             { return nil }
func (noMetrics) RunHealthchecks()                       {}
func (noMetrics) Unregister(string)                      {}
func (noMetrics) UnregisterAll()                         {}

// nilMetric is the no-op metric of metric's kind. metric is a metric or a function
// returning one, since go-metrics' GetOrRegister takes either.
func nilMetric(metric any) any {
	switch metric.(type) {
	case func() metrics.Histogram, metrics.Histogram:
		return metrics.NilHistogram{}
	case func() metrics.Meter, metrics.Meter:
		return metrics.NilMeter{}
	case func() metrics.Counter, metrics.Counter:
		return metrics.NilCounter{}
	case func() metrics.Gauge, metrics.Gauge:
		return metrics.NilGauge{}
	case func() metrics.GaugeFloat64, metrics.GaugeFloat64:
		return metrics.NilGaugeFloat64{}
	case func() metrics.Timer, metrics.Timer:
		return metrics.NilTimer{}
	}
	// For any other constructor, build the metric unregistered, as a registry would.
	if v := reflect.ValueOf(metric); v.Kind() == reflect.Func && v.Type().NumIn() == 0 && v.Type().NumOut() == 1 {
		return v.Call(nil)[0].Interface()
	}
	return metric
}

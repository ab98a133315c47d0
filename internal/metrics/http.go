package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// httpCollectors are the HTTP commands' collectors, registered on the first request. So a
// router that serves no command exports none of them. The gauge of whether the commands are
// served is registered apart, when the router starts its HTTP part.
type httpCollectors struct {
	once     sync.Once
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec

	enabledOnce sync.Once
	enabled     prometheus.Gauge
}

// SetHTTPEnabled exports onceflow_http_commands_enabled. It is 1 while the router serves its
// plugins' HTTP commands on http.listen, and 0 when http.listen is empty. So a dashboard
// panel of the commands can say they are not enabled, rather than show no data.
func (m *Metrics) SetHTTPEnabled(on bool) {
	v, _ := httpByMetrics.LoadOrStore(m, &httpCollectors{})
	c := v.(*httpCollectors)
	c.enabledOnce.Do(func() {
		c.enabled = prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "onceflow", Name: "http_commands_enabled",
			Help: "1 when the router serves its plugins' HTTP commands on http.listen, 0 when http.listen is empty (the default).",
		})
		m.Registry.MustRegister(c.enabled)
	})
	if on {
		c.enabled.Set(1)
	} else {
		c.enabled.Set(0)
	}
}

var httpByMetrics sync.Map // *Metrics → *httpCollectors

// ObserveHTTP records one answered HTTP command request.
func (m *Metrics) ObserveHTTP(method, path string, status int, elapsed time.Duration) {
	v, _ := httpByMetrics.LoadOrStore(m, &httpCollectors{})
	c := v.(*httpCollectors)
	c.once.Do(func() {
		c.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "http_requests_total",
			Help: "HTTP command requests by route and status (409: the token's first request was still running; 422: the token was used with another body).",
		}, []string{"method", "path", "status"})
		c.seconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "onceflow", Name: "http_request_seconds", Help: "Time to answer an HTTP command request.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"method", "path"})
		m.Registry.MustRegister(c.requests, c.seconds)
	})
	c.requests.WithLabelValues(method, path, strconv.Itoa(status)).Inc()
	c.seconds.WithLabelValues(method, path).Observe(elapsed.Seconds())
}

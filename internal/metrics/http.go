package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// httpCollectors are the HTTP commands' collectors, registered on the first request. So a
// router that serves no command exports none.
type httpCollectors struct {
	once     sync.Once
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
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

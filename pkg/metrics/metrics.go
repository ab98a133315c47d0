// Package metrics holds onceflow's Prometheus collectors on a dedicated registry (never the
// global default), served by the admin listener at /metrics.
package metrics

import (
	"context"
	"database/sql"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is the set of collectors.
type Metrics struct {
	Registry       *prometheus.Registry
	Deliveries     *prometheus.CounterVec   // biz_type, outcome
	HandlerSeconds *prometheus.HistogramVec // biz_type, outcome
	RelayPublished prometheus.Counter
	RelayErrors    prometheus.Counter
	Consumers      *ConsumerCollector       // per-partition consumer gauges; Add the subscribers
	PrepareSeconds *prometheus.HistogramVec // biz_type, outcome: a delivery's outside calls (BatchPreparer)
	CallSeconds    *prometheus.HistogramVec // plugin, step, outcome: one outside call
}

// New registers the collectors. db, when not nil, feeds the gauges read at scrape time
// (inbox rows by status, oldest unpublished outbox row, parked outbox rows).
func New(db *sql.DB) *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "inbox_deliveries_total",
			Help: "Deliveries by outcome: processed, duplicate (blocked), conflict, quarantined.",
		}, []string{"biz_type", "outcome"}),
		HandlerSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "onceflow", Name: "inbox_handler_seconds",
			Help:    "Time from delivery to committed outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"biz_type", "outcome"}),
		RelayPublished: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "relay_published_total", Help: "Outbox events published to Kafka.",
		}),
		RelayErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "relay_errors_total", Help: "Failed relay batches (retried).",
		}),
		Consumers: NewConsumerCollector(),
		PrepareSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "onceflow", Name: "inbox_prepare_seconds",
			Help:    "Time a delivery's outside calls took before it joined a batch (BatchPreparer); outcome ok or error.",
			Buckets: callBuckets,
		}, []string{"biz_type", "outcome"}),
		CallSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "onceflow", Name: "plugin_call_seconds",
			Help:    "One outside call of a plugin's step (plugins that report them through PluginEnv.ObserveCall).",
			Buckets: callBuckets,
		}, []string{"plugin", "step", "outcome"}),
	}
	r.MustRegister(m.Deliveries, m.HandlerSeconds, m.RelayPublished, m.RelayErrors, m.Consumers, m.PrepareSeconds, m.CallSeconds,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if db != nil {
		r.MustRegister(&dbCollector{db: db,
			inboxRows: prometheus.NewDesc("onceflow_inbox_rows", "Inbox rows by biz type and status.", []string{"biz_type", "status"}, nil),
			oldest:    prometheus.NewDesc("onceflow_outbox_oldest_unpublished_seconds", "Age of the oldest unpublished outbox row (0 when none).", nil, nil),
			pending:   prometheus.NewDesc("onceflow_outbox_unpublished_rows", "Unpublished outbox rows.", nil, nil),
			parked: prometheus.NewDesc("onceflow_outbox_parked_rows",
				"Outbox events the relay parked (outbox_parked), not published: held=false Kafka refuses them for good, held=true they wait behind one of their key that it refuses.",
				[]string{"held"}, nil),
		})
	}
	return m
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

type dbCollector struct {
	db                                 *sql.DB
	inboxRows, oldest, pending, parked *prometheus.Desc
}

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inboxRows
	ch <- c.oldest
	ch <- c.pending
	ch <- c.parked
}

func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if rows, err := c.db.QueryContext(ctx, `SELECT biz_type, status, COUNT(*) FROM inbox GROUP BY biz_type, status`); err == nil {
		for rows.Next() {
			var biz, st string
			var n float64
			if rows.Scan(&biz, &st, &n) == nil {
				ch <- prometheus.MustNewConstMetric(c.inboxRows, prometheus.GaugeValue, n, biz, st)
			}
		}
		rows.Close()
	}
	var oldest sql.NullTime
	var pending float64
	if err := c.db.QueryRowContext(ctx, `SELECT MIN(created_at), COUNT(*) FROM outbox WHERE published_at IS NULL`).Scan(&oldest, &pending); err == nil {
		age := 0.0
		if oldest.Valid {
			age = max(time.Since(oldest.Time).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, pending)
	}
	var refused, held float64
	if err := c.db.QueryRowContext(ctx, `SELECT COALESCE(SUM(held_behind IS NULL), 0), COALESCE(SUM(held_behind IS NOT NULL), 0) FROM outbox_parked`).Scan(&refused, &held); err == nil {
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, refused, "false")
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, held, "true")
	}
}

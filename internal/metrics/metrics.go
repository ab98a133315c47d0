// Package metrics holds onceflow's Prometheus collectors on a dedicated registry, never the
// global default. The admin listener serves them at /metrics.
package metrics

import (
	"context"
	"database/sql"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceflow/onceflow/internal/buildinfo"
)

// Metrics is the set of collectors.
type Metrics struct {
	Registry       *prometheus.Registry
	Deliveries     *prometheus.CounterVec   // biz_type, outcome
	HandlerSeconds *prometheus.HistogramVec // biz_type, outcome
	RelayPublished prometheus.Counter
	RelayErrors    prometheus.Counter
	Consumers      *ConsumerCollector       // per-partition consumer gauges; Add the subscribers
	PrepareSeconds *prometheus.HistogramVec // biz_type, outcome: a delivery's outside calls (its Prepare, before its batch)
	CallSeconds    *prometheus.HistogramVec // plugin, step, outcome: one outside call
	BreakerState   *prometheus.GaugeVec     // biz_type: 0 closed, 1 open, 2 half-open
	BreakerOpens   *prometheus.CounterVec   // biz_type
	Redeliveries   *prometheus.CounterVec   // biz_type, outcome: delayed redeliveries run

	db         *dbCollector // nil without a database
	throughput *throughput  // deliveries since the start (Observe), for the console
	history    *history     // deliveries per minute not yet in HistoryTable; nil without a database
	breakers   breakers     // the plugins' circuit breakers (SetBreaker), for the console
}

// New registers the collectors. db, when not nil, feeds the database gauges. They are the
// inbox rows by status, the failed ones by reason, the oldest unpublished outbox row (its age
// from its creation and since it became publishable) and the parked outbox rows. They are
// read in the background at most every dbRefresh.
func New(db *sql.DB) *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "inbox_deliveries_total",
			Help: "Deliveries by outcome: processed, duplicate (blocked), held (the key is quarantined: not run until a replay), conflict, quarantined.",
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
			Help:    "Time a delivery's outside calls took before it joined a batch (the plugin's Prepare); outcome ok or error.",
			Buckets: callBuckets,
		}, []string{"biz_type", "outcome"}),
		CallSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "onceflow", Name: "plugin_call_seconds",
			Help:    "One outside call of a plugin's step (plugins that report them through PluginEnv.ObserveCall).",
			Buckets: callBuckets,
		}, []string{"plugin", "step", "outcome"}),
		BreakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "onceflow", Name: "inbox_breaker_state",
			Help: "A plugin's circuit breaker: 0 closed, 1 open (its deliveries wait), 2 half-open (one probe runs).",
		}, []string{"biz_type"}),
		BreakerOpens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "inbox_breaker_opens_total",
			Help: "Times a plugin's circuit breaker opened (a failed probe opens it again).",
		}, []string{"biz_type"}),
		Redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "inbox_redeliveries_total",
			Help: "Delayed redeliveries run, by outcome: processed, delayed (again), quarantined (rounds used up), duplicate, held.",
		}, []string{"biz_type", "outcome"}),
		throughput: newThroughput(time.Now()),
	}
	r.MustRegister(m.Deliveries, m.HandlerSeconds, m.RelayPublished, m.RelayErrors, m.Consumers, m.PrepareSeconds, m.CallSeconds,
		m.BreakerState, m.BreakerOpens, m.Redeliveries,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newBuildInfo(buildinfo.Read()))
	if db != nil {
		m.db = &dbCollector{db: db,
			inboxRows: prometheus.NewDesc("onceflow_inbox_rows", "Inbox rows by biz type and status; failed: quarantined (rows waiting for a delayed redelivery are onceflow_inbox_delayed_rows).", []string{"biz_type", "status"}, nil),
			delayed:   prometheus.NewDesc("onceflow_inbox_delayed_rows", "Inbox rows waiting for a delayed redelivery, by biz type.", []string{"biz_type"}, nil),
			failed: prometheus.NewDesc("onceflow_inbox_failed_rows",
				"Quarantined (failed) inbox rows by biz type and reason: poison, retries_exhausted, permanent, …; rows waiting for a delayed redelivery are onceflow_inbox_delayed_rows.",
				[]string{"biz_type", "reason"}, nil),
			oldest: prometheus.NewDesc("onceflow_outbox_oldest_unpublished_seconds", "Age of the oldest unpublished outbox row from its created_at (0 when none).", nil, nil),
			publishable: prometheus.NewDesc("onceflow_outbox_oldest_publishable_seconds",
				"Age of the oldest unpublished outbox row since it became publishable: its creation, or for a row put back by `router outbox retry` (or committed late) this router's first read of it (0 when none).",
				nil, nil),
			pending: prometheus.NewDesc("onceflow_outbox_unpublished_rows", "Unpublished outbox rows.", nil, nil),
			parked: prometheus.NewDesc("onceflow_outbox_parked_rows",
				"Outbox events the relay parked (outbox_parked), not published: held=false Kafka refuses them for good, held=true they wait behind one of their key that it refuses.",
				[]string{"held"}, nil),
		}
		r.MustRegister(m.db)
		m.history = newHistory(db)
		r.MustRegister(m.history.dropped)
	}
	return m
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// dbRefresh is how old the database gauges may get. A scrape serves the latest values. When
// they are older than this, it starts one refresh in the background. However often /metrics
// is scraped, the queries run at most once per dbRefresh. A GROUP BY over the inbox is among
// them.
const dbRefresh = 15 * time.Second

// dbQueryTimeout bounds one refresh. The first scrape waits this long for the first
// refresh.
const dbQueryTimeout = 5 * time.Second

type dbCollector struct {
	db                                                               *sql.DB
	inboxRows, failed, delayed, oldest, publishable, pending, parked *prometheus.Desc
	since                                                            publishable // the outbox rows' publishable times, for the refresh in flight

	mu         sync.Mutex
	cached     DBStats
	refreshing chan struct{} // closed when the refresh in flight ends; nil: none
	queries    atomic.Int64  // refreshes run (tests)
	// want is the generation the next answer must come from. gen is the generation of the
	// refresh in flight, and cachedGen that of cached. Invalidate raises want, so the
	// figures read before it are not served again.
	want, gen, cachedGen int64
}

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inboxRows
	ch <- c.failed
	ch <- c.delayed
	ch <- c.oldest
	ch <- c.publishable
	ch <- c.pending
	ch <- c.parked
}

// Collect serves the cached gauges and refreshes them in the background when stale. The
// first scrape waits for the first refresh.
func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for _, r := range s.InboxRows {
		ch <- prometheus.MustNewConstMetric(c.inboxRows, prometheus.GaugeValue, float64(r.Rows), r.BizType, r.Status)
	}
	for _, r := range s.FailedReasons {
		ch <- prometheus.MustNewConstMetric(c.failed, prometheus.GaugeValue, float64(r.Rows), r.BizType, r.Reason)
	}
	delayed := map[string]int64{}
	for _, r := range s.InboxRows {
		delayed[r.BizType] += 0 // every biz type with rows has a series, 0 when none waits
	}
	for _, r := range s.Delayed {
		delayed[r.BizType] += r.Rows
	}
	for biz, n := range delayed {
		ch <- prometheus.MustNewConstMetric(c.delayed, prometheus.GaugeValue, float64(n), biz)
	}
	if s.OutboxRead {
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, s.OldestUnpublished.Seconds())
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(s.Unpublished))
	}
	if s.PublishableRead {
		ch <- prometheus.MustNewConstMetric(c.publishable, prometheus.GaugeValue, s.OldestPublishable.Seconds())
	}
	if s.ParkedRead {
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(s.ParkedRefused), "false")
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(s.ParkedHeld), "true")
	}
}

// stats returns the cached figures. When they are older than dbRefresh, it starts one
// refresh in the background. The first call waits for a refresh. So does the first call
// after Invalidate, for a refresh started after the invalidation.
func (c *dbCollector) stats() DBStats {
	for {
		c.mu.Lock()
		fresh := c.cachedGen >= c.want && !c.cached.At.IsZero()
		if (time.Since(c.cached.At) > dbRefresh || !fresh) && c.refreshing == nil {
			done := make(chan struct{})
			c.refreshing, c.gen = done, c.want
			go func(gen int64) {
				s := c.query()
				c.mu.Lock()
				c.cached, c.cachedGen, c.refreshing = s, gen, nil
				c.mu.Unlock()
				close(done)
			}(c.gen)
		}
		wait := c.refreshing
		if fresh || wait == nil {
			s := c.cached
			c.mu.Unlock()
			return s
		}
		c.mu.Unlock()
		<-wait
	}
}

// invalidate makes the next stats wait for figures read after it.
func (c *dbCollector) invalidate() {
	c.mu.Lock()
	c.want++
	c.mu.Unlock()
}

// query reads the figures. A query that fails leaves its figures out.
func (c *dbCollector) query() DBStats {
	ctx, cancel := context.WithTimeout(context.Background(), dbQueryTimeout)
	defer cancel()
	c.queries.Add(1)
	var s DBStats
	if rows, err := c.db.QueryContext(ctx, `SELECT biz_type, status, COUNT(*) FROM inbox GROUP BY biz_type, status`); err == nil {
		for rows.Next() {
			var r InboxCount
			if rows.Scan(&r.BizType, &r.Status, &r.Rows) == nil {
				s.InboxRows = append(s.InboxRows, r)
			}
		}
		rows.Close()
	}
	s.FailedReasons = failedReasons(ctx, c.db, s.InboxRows)
	s.FailedErrors = failedErrors(ctx, c.db, s.InboxRows)
	s.splitDelayed()
	var oldest sql.NullTime
	if err := c.db.QueryRowContext(ctx, `SELECT MIN(created_at), COUNT(*) FROM outbox WHERE published_at IS NULL`).Scan(&oldest, &s.Unpublished); err == nil {
		s.OutboxRead = true
		if oldest.Valid {
			s.OldestUnpublished = max(time.Since(oldest.Time), 0)
		}
		if age, err := c.since.read(ctx, c.db); err == nil {
			s.OldestPublishable, s.PublishableRead = age, true
		}
	}
	if err := c.db.QueryRowContext(ctx, `SELECT COUNT(*) - COUNT(held_behind), COUNT(held_behind) FROM outbox_parked`).Scan(&s.ParkedRefused, &s.ParkedHeld); err == nil {
		s.ParkedRead = true
	}
	s.At = time.Now()
	return s
}

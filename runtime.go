package onceflow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Runtime is one router process's pipeline, as `router run` starts it: for every plugin its
// handler, inbox and (for handlers that batch) group commit, a Kafka subscriber per topic in
// the plugin's consumer group, all on one Watermill router; the outbox relay
// (cfg.Relay.Enabled), the inbox cleaner, and the admin listener (cfg.Admin.Listen:
// /healthz, /readyz, /metrics).
type Runtime struct {
	a       *app
	plugins []plugin
}

// New returns the runtime of plugins under cfg: each plugin's section of cfg.Plugins is
// applied (topics and consumer_group replace the declaration's; the rest is the plugin's own
// configuration). It checks cfg and the plugins and connects to nothing; Run does. Start
// from DefaultConfig (or LoadConfig); a 0 means what it means in the configuration file
// (relay.linger 0 publishes at once). A nil logger logs nothing. Errors of bad input are
// marked as such (ExitCode 2).
func New(cfg Config, plugins []inbox.Plugin, logger watermill.LoggerAdapter) (*Runtime, error) {
	settings.Resolve(&cfg)
	if err := cfg.validate(); err != nil {
		return nil, badInput(fmt.Errorf("config: %w", err))
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	a := &app{cfg: cfg, logger: logger, gc: "not set by the runtime (onceflow.New)"}
	return newRuntime(a, plugins)
}

func newRuntime(a *app, plugins []inbox.Plugin) (*Runtime, error) {
	if len(plugins) == 0 {
		return nil, badInput(errors.New("no plugins to run"))
	}
	r := &Runtime{a: a}
	seen := map[string]bool{}
	for _, p := range plugins {
		if seen[p.Name] {
			return nil, badInput(fmt.Errorf("plugin %q given twice", p.Name))
		}
		seen[p.Name] = true
		rp, err := resolvePlugin(p, a.cfg.Plugins[p.Name])
		if err != nil {
			return nil, err
		}
		r.plugins = append(r.plugins, rp)
	}
	return r, nil
}

// Plugins returns the plugins as the runtime runs them: Topics and ConsumerGroup as
// configured.
func (r *Runtime) Plugins() []inbox.Plugin {
	out := make([]inbox.Plugin, len(r.plugins))
	for i, p := range r.plugins {
		out[i] = p.Plugin
	}
	return out
}

// deliveryOutcomes and redeliveryOutcomes are the outcomes whose counters start at zero
// (metrics.InitBizType).
var (
	deliveryOutcomes = []string{string(inbox.OutcomeProcessed), string(inbox.OutcomeDuplicate), string(inbox.OutcomeHeld),
		string(inbox.OutcomeConflict), string(inbox.OutcomeQuarantined)}
	redeliveryOutcomes = []string{string(inbox.OutcomeProcessed), string(inbox.OutcomeDelayed), string(inbox.OutcomeQuarantined),
		string(inbox.OutcomeDuplicate), string(inbox.OutcomeHeld)}
)

// Run runs the pipeline until ctx is cancelled or a part of it fails, then stops it: the
// router first (its handlers finish), then the relay and the cleaner, the group commits,
// the plugins' handlers that are io.Closers, and the admin listener. It returns nil after a
// cancellation and the first error otherwise.
func (r *Runtime) Run(ctx context.Context) error {
	a, plugins := r.a, r.plugins
	withRelay := a.cfg.Relay.Enabled
	kc := a.kafka()
	if err := kc.Validate(); err != nil {
		return badInput(err)
	}
	tables := append([]string(nil), frameworkTables...)
	for _, p := range plugins {
		tables = append(tables, p.Tables...)
	}
	if withRelay && a.cfg.Relay.Shards > 1 {
		tables = append(tables, outbox.MemberTable) // checked at start, like `router relay` does
	}
	tables = append(tables, metrics.HistoryTable) // the deliveries per minute the router adds to
	db, err := a.openAppDB(ctx, 0)
	if err != nil {
		return err
	}
	defer db.Close()
	// A plugin whose tables exist only in another database's dialect is refused before its
	// tables are looked for.
	for _, p := range plugins {
		if p.Migrations == nil {
			continue
		}
		if err := (migrations.Set{Name: p.Name, FS: p.Migrations}).Supports(dbx.DialectOf(db)); err != nil {
			return badInput(err)
		}
	}
	if err := checkTables(ctx, db, tables...); err != nil {
		return err
	}
	var topics []string
	for _, p := range plugins {
		topics = append(topics, p.Topics...)
	}
	if _, err := kc.CheckTopics(topics...); err != nil {
		return err
	}
	if err := a.checkWrittenTopics(kc, plugins); err != nil {
		return err
	}
	a.logger.Info("router starting", watermill.LogFields{"dsn": dbx.MaskDSN(a.cfg.DB.DSN), "dialect": dbx.DialectOf(db), "brokers": kc.Brokers,
		"session_timeout": kc.SessionTimeout, "rebalance_timeout": kc.RebalanceTimeout, "relay": withRelay, "gc": a.gc})
	a.warnRetention(kc, topics)
	stopTracing, err := a.startTracing(ctx) // otel.*: the inboxes and the relay built below trace
	if err != nil {
		return err
	}
	defer stopTracing() // deferred early, so run late: flushes the spans once everything stopped

	m := metrics.New(db)
	lags, err := kc.NewLagReader() // lag without transaction markers: the metric's and the console's
	if err != nil {
		return err
	}
	defer lags.Close()
	m.Consumers.JudgeLag(lags)
	m.AddLagBound(a.cfg.Relay.LagBound)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, a.logger)
	if err != nil {
		return err
	}
	// Outermost: a parallel subscriber's claim learns of each ack or nack from the handler's
	// goroutine (a panic recovered by Recoverer is a nack), instead of sweeping its window.
	router.AddMiddleware(kafkax.AckOnReturn, middleware.Recoverer)
	obs := &observer{m: m}
	budget := kafkax.NewBudget(a.cfg.Kafka.Parallel.MaxInFlightBytes) // one for every subscriber of the router
	var inboxes []*inbox.Inbox
	for _, p := range plugins {
		ib, closeHandler, err := a.buildInbox(ctx, db, p, obs)
		if err != nil {
			return err
		}
		inboxes = append(inboxes, ib)
		m.InitBizType(p.BizType, deliveryOutcomes, redeliveryOutcomes)
		if ib.BreakerEnabled() {
			m.SetBreaker(p.BizType, int(inbox.BreakerClosed), time.Time{}, time.Time{}, "")
		}
		defer closeHandler() // deferred first, so run last: after the router and the Batcher stopped
		handler := ib.HandlerFunc
		if bc := a.cfg.Inbox.Batch; bc.MaxSize > 1 {
			b, err := ib.NewBatcher(bc)
			if err != nil {
				return badInput(fmt.Errorf("plugin %s: group commit: %w", p.Name, err))
			}
			defer b.Close() // after the router stopped: its handlers are done
			biz := p.BizType
			b.ObservePrepares(func(elapsed time.Duration, err error) { m.ObservePrepare(biz, elapsed, err) })
			m.AddPreparing(biz, func() int64 { return b.Stats().Preparing })
			handler = b.HandlerFunc
			a.logger.Info("group commit on", watermill.LogFields{"plugin": p.Name, "batch_size": bc.MaxSize, "batch_workers": bc.Workers})
		}
		for _, t := range p.Topics {
			sub, err := a.subscriber(kc, p.ConsumerGroup, budget)
			if err != nil {
				return kafkax.Unreachable(kc.Brokers, err)
			}
			if ps, ok := sub.(metrics.PartitionStatsSource); ok { // not with kafka.window 1
				m.Consumers.Add(ps)
			}
			router.AddConsumerHandler(p.Name+"/"+t, t, sub, handler(t))
		}
		a.logger.Info("plugin", watermill.LogFields{"plugin": p.Name, "topics": p.Topics, "consumer_group": p.ConsumerGroup, "biz_type": p.BizType})
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4+len(inboxes))
	if withRelay {
		relay, closeRelay, err := a.newRelay(db, kc)
		if err != nil {
			return err
		}
		defer closeRelay()
		obs.wake = relay.Wake // set before the router starts delivering
		stopMetrics := relayMetrics(ctx, m, relay)
		defer stopMetrics()
		wg.Add(1)
		go func() { defer wg.Done(); errs <- relay.Run(ctx) }()
	}
	cleaner, err := inboxops.NewCleaner(db, a.cfg.cleanerConfig(), a.logger)
	if err != nil {
		return badInput(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); errs <- cleaner.Run(ctx) }()
	for _, ib := range inboxes { // each plugin's delayed redeliveries (inbox.delayed_retries)
		wg.Add(1)
		go func() { defer wg.Done(); errs <- ib.RunRedeliveries(ctx) }()
	}

	// The deliveries per minute, added to inbox_history every 10 s and once more after the
	// router and the HTTP listener stopped (deferred before them, so run after them).
	histCtx, stopHist := context.WithCancel(context.WithoutCancel(ctx))
	histDone := make(chan struct{})
	go func() {
		defer close(histDone)
		m.RunHistory(histCtx, metrics.HistoryFlushEvery, func(err error) {
			a.logger.Error("inbox history (the console's chart; counts not written are kept for the next flush)", err, nil)
		})
	}()
	defer func() { stopHist(); <-histDone }()

	stopAdmin, err := a.startAdmin(ctx, db, kc, m)
	if err != nil {
		return err
	}
	defer stopAdmin()
	stopHTTP, err := a.startHTTP(ctx, db, plugins, obs, m)
	if err != nil {
		return err
	}
	defer stopHTTP() // before the relay and the router stop (deferred calls run last first)

	runErr := router.Run(ctx)
	cancel()
	wg.Wait()
	close(errs)
	for e := range errs {
		if e != nil && runErr == nil {
			runErr = e
		}
	}
	a.logger.Info("router stopped", nil)
	return runErr
}

// buildInbox builds p's handler and its inbox: the one handler path that `run`, `replay`
// and `inbox retry` share. The returned func closes the handler when it is an io.Closer;
// call it once nothing uses the inbox any more.
func (a *app) buildInbox(ctx context.Context, db *sql.DB, p plugin, obs inbox.Observer) (*inbox.Inbox, func(), error) {
	env := inbox.PluginEnv{DB: db, Logger: a.logger.With(watermill.LogFields{"plugin": p.Name}), DecodeConfig: p.decodeConfig}
	if o, ok := obs.(*observer); ok && o.m != nil {
		env.ObserveCall = func(step string, elapsed time.Duration, err error) { o.m.ObserveCall(p.Name, step, elapsed, err) }
	}
	h, err := p.Build(ctx, env)
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("plugin %s: %w", p.Name, err)
	}
	closeHandler := func() {
		if c, ok := h.(io.Closer); ok {
			if err := c.Close(); err != nil {
				a.logger.Error("plugin handler close", err, watermill.LogFields{"plugin": p.Name})
			}
		}
	}
	var ib *inbox.Inbox
	if p.command != nil {
		ib, err = inbox.NewCommand(db, h, a.cfg.inboxConfig(p.BizType, p.KeyLogField, true), a.logger, obs)
	} else {
		ib, err = inbox.New(db, h, a.cfg.inboxConfig(p.BizType, p.KeyLogField, false), a.logger, obs)
	}
	if err != nil {
		closeHandler()
		return nil, nil, badInput(fmt.Errorf("plugin %s: %w", p.Name, err))
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ib.CheckServer(cctx); err != nil {
		closeHandler()
		return nil, nil, fmt.Errorf("plugin %s: %w", p.Name, err)
	}
	return ib, closeHandler, nil
}

// subscriber returns the consumer of a plugin's topic: the parallel one (up to kafka.window
// messages per partition in flight within the router's byte budget, which group commit
// needs to fill its batches and slow calls need to overlap; values over
// inbox.max_payload_bytes cut before they wait) or, with kafka.window 1, watermill-kafka's.
func (a *app) subscriber(kc kafkax.Config, group string, budget *kafkax.Budget) (message.Subscriber, error) {
	if a.cfg.Kafka.Parallel.Window > 1 {
		return kc.NewParallelSubscriber(group, a.cfg.parallelConfig(budget), a.logger)
	}
	return kc.NewSubscriber(group, a.logger)
}

// warnRetention warns when Kafka can replay messages older than the inbox remembers: a
// replayed message whose inbox row was cleaned would be processed again.
func (a *app) warnRetention(kc kafkax.Config, topics []string) {
	for _, t := range topics {
		r, err := kc.TopicRetention(t)
		if err != nil {
			a.logger.Info("could not read topic retention", watermill.LogFields{"topic": t, "err": err.Error()})
			continue
		}
		if r < 0 || r > a.cfg.Inbox.Retention {
			a.logger.Error("inbox retention is shorter than the topic's: a replay from the oldest offset could re-run cleaned messages",
				fmt.Errorf("topic %s retention %s > inbox.retention %s", t, fmtRetention(r), a.cfg.Inbox.Retention),
				watermill.LogFields{"topic": t})
		}
	}
}

func fmtRetention(d time.Duration) string {
	if d < 0 {
		return "infinite"
	}
	return d.String()
}

// observer records deliveries in the metrics and, after one that committed work (and so,
// possibly, outbox rows), wakes this process's relay instead of leaving the rows to its
// next poll.
type observer struct {
	m    *metrics.Metrics
	wake func()
}

// BreakerChanged implements inbox.BreakerObserver.
func (o *observer) BreakerChanged(biz string, s inbox.BreakerStatus) {
	o.m.SetBreaker(biz, int(s.State), s.Since, s.ProbeAt, s.LastError)
}

// Redelivered implements inbox.RedeliveryObserver.
func (o *observer) Redelivered(biz string, r inbox.Result) {
	o.m.Redeliveries.WithLabelValues(biz, string(r.Outcome)).Inc()
}

func (o *observer) Delivered(biz string, r inbox.Result, d time.Duration) {
	o.m.Observe(biz, string(r.Outcome), d)
	if o.wake != nil && r.Outcome == inbox.OutcomeProcessed {
		o.wake()
	}
}

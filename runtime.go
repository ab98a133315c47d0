package onceflow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Runtime is one router process's pipeline, as `router run` starts it. For every plugin it
// runs the handler and the inbox, and group commit when inbox.batch_size is above 1. It
// reads each of a plugin's topics in the plugin's consumer group, with one Kafka subscriber
// per topic, each read by a consumer loop of its own. It runs the inbox cleaner, and the
// outbox relay when cfg.Relay.Enabled is set. When cfg.Admin.Listen is set, it serves
// /healthz, /readyz, /metrics and the operator console there. When cfg.HTTP.Listen is set,
// it serves the plugins' HTTP commands there.
type Runtime struct {
	s       *Setup
	plugins []Plugin
	// wrapRun wraps the run of each part. Only tests set it, and parts_test.go stops a part
	// with it.
	wrapRun func(part string, run func(context.Context) error) func(context.Context) error
}

// New returns the runtime of plugins under cfg. It applies each plugin's section of
// cfg.Plugins. There topics and consumer_group replace the declaration's, and the other
// keys are the plugin's own configuration. New checks cfg and the plugins and connects to
// nothing. Run connects. Start from DefaultConfig or LoadConfig. A 0 means what it means in
// the configuration file, so relay.linger 0 publishes at once. A nil logger logs nothing.
// Errors of bad input match ErrBadInput.
func New(cfg Config, plugins []inbox.Plugin, logger watermill.LoggerAdapter) (*Runtime, error) {
	settings.Resolve(&cfg)
	if err := cfg.validate(); err != nil {
		return nil, BadInput(fmt.Errorf("config: %w", err))
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	s := &Setup{Config: cfg, logger: logger, gc: "not set by the runtime (onceflow.New)"}
	if len(plugins) == 0 {
		return nil, BadInput(errors.New("no plugins to run"))
	}
	r := &Runtime{s: s}
	seen := map[string]bool{}
	for _, p := range plugins {
		if seen[p.Name] {
			return nil, BadInput(fmt.Errorf("plugin %q given twice", p.Name))
		}
		seen[p.Name] = true
		rp, err := resolvePlugin(p, s.Config.Plugins[p.Name])
		if err != nil {
			return nil, err
		}
		r.plugins = append(r.plugins, rp)
	}
	return r, nil
}

// Runtime returns the runtime of plugins under the setup's configuration, as `router run`
// runs it. The plugins come from Plugins. The runtime logs with the setup's logger, and its
// console's replays run the binary's plugins. Runtime connects to nothing. Run connects.
func (s *Setup) Runtime(plugins []Plugin) *Runtime { return &Runtime{s: s, plugins: plugins} }

// Plugins returns the plugins as the runtime runs them, with Topics and ConsumerGroup as
// configured.
func (r *Runtime) Plugins() []inbox.Plugin {
	out := make([]inbox.Plugin, len(r.plugins))
	for i, p := range r.plugins {
		out[i] = p.Plugin
	}
	return out
}

// deliveryOutcomes and redeliveryOutcomes are the outcomes whose counters
// metrics.InitBizType starts at zero.
var (
	deliveryOutcomes = []string{string(engine.OutcomeProcessed), string(engine.OutcomeDuplicate), string(engine.OutcomeHeld),
		string(engine.OutcomeConflict), string(engine.OutcomeQuarantined)}
	redeliveryOutcomes = []string{string(engine.OutcomeProcessed), string(engine.OutcomeDelayed), string(engine.OutcomeQuarantined),
		string(engine.OutcomeDuplicate), string(engine.OutcomeHeld)}
)

// Run runs the pipeline's parts until ctx is cancelled or one of them fails. The parts are
// the database pool, the topic checks, tracing, the metrics, the relay and the inbox
// cleaner. Then come each plugin's inbox and delayed redeliveries, the history of
// deliveries, the admin listener, the HTTP commands and the consumer loops. They start in
// that order and stop in reverse order, so the router stops first and the pool last. Each
// part's run ends before its stop. No part is restarted. The first one that fails stops the
// others, and Run returns its error, which names the part. Run returns nil after a
// cancellation.
func (r *Runtime) Run(ctx context.Context) error {
	p := &pipeline{s: r.s, plugins: r.plugins, kc: r.s.Kafka(), inboxes: make([]*engine.Inbox, len(r.plugins)),
		delivers: make([]func(topic string) kafkax.DeliverFunc, len(r.plugins))}
	if err := p.kc.Validate(); err != nil {
		return BadInput(err)
	}
	parts := slices.Concat(
		[]part{
			p.database(),
			p.topics(),
			p.s.tracing(), // the parts below trace with it, and it flushes their spans once they stopped
			p.metrics(),
			when(p.s.Config.Relay.Enabled, p.relay()), // stops after every part that commits events, so it publishes them
			p.cleaner(),
		},
		p.each("inbox", p.inbox), // the group commits, then the handlers, close once nothing delivers to them
		p.each("redeliverer", p.redeliverer),
		[]part{
			p.history(), // its last flush counts the deliveries of the parts below
			p.admin(),
			p.http(),   // running requests finish
			p.router(), // stops first, so its handlers finish
		},
	)
	if r.wrapRun != nil {
		for i := range parts {
			if parts[i].run != nil {
				parts[i].run = r.wrapRun(parts[i].name, parts[i].run)
			}
		}
	}
	err := runParts(ctx, r.s.logger, parts)
	r.s.logger.Info("router stopped", nil)
	return err
}

// pipeline is what the parts of a process share. A part's start sets the fields that the
// parts after it use.
type pipeline struct {
	s       *Setup
	plugins []Plugin
	kc      kafkax.Config

	db   *sql.DB
	m    *metrics.Metrics
	lags *kafkax.LagReader
	obs  *observer // the deliveries' metrics and the relay's wake-ups, in the runtime only

	inboxes  []*engine.Inbox                         // by plugin, in the order of plugins
	delivers []func(topic string) kafkax.DeliverFunc // by plugin, the inbox's or its group commit's
}

// each returns one part per plugin, named kind and the plugin's name.
func (p *pipeline) each(kind string, of func(i int) part) []part {
	out := make([]part, len(p.plugins))
	for i, pl := range p.plugins {
		out[i] = of(i)
		out[i].name = kind + " " + pl.Name
	}
	return out
}

// observer returns the runtime's observer, or nil outside the runtime.
func (p *pipeline) observer() engine.Observer {
	if p.obs == nil {
		return nil
	}
	return p.obs
}

// database opens the pool and checks it. Each plugin's migrations must support the pool's
// dialect, and every table the runtime reads must exist.
func (p *pipeline) database() part {
	return part{name: "database",
		start: func(ctx context.Context) error {
			db, err := p.s.OpenDB(ctx, 0)
			if err != nil {
				return err
			}
			if err := p.checkDatabase(ctx, db); err != nil {
				_ = db.Close()
				return err
			}
			p.db = db
			return nil
		},
		stop: func() { _ = p.db.Close() },
	}
}

func (p *pipeline) checkDatabase(ctx context.Context, db *sql.DB) error {
	tables := append([]string(nil), frameworkTables...)
	for _, pl := range p.plugins {
		tables = append(tables, pl.Tables...)
	}
	if p.s.Config.Relay.Enabled && p.s.Config.Relay.Shards > 1 {
		tables = append(tables, outbox.MemberTable) // checked at start, as `router relay` does
	}
	tables = append(tables, metrics.HistoryTable) // the deliveries per minute the router adds to
	// A plugin whose migrations exist only in another database's dialect is refused before
	// its tables are looked for.
	for _, pl := range p.plugins {
		if pl.Migrations == nil {
			continue
		}
		if err := (migrations.Set{Name: pl.Name, FS: pl.Migrations}).Supports(dbx.DialectOf(db)); err != nil {
			return BadInput(err)
		}
	}
	return checkTables(ctx, db, tables...)
}

// topics checks that the topics the plugins read exist. It checks the topics they write to
// as well when relay.check_topics is on. It warns of a topic kept longer than the inbox
// remembers.
func (p *pipeline) topics() part {
	return part{name: "topics",
		start: func(context.Context) error {
			a := p.s
			var topics []string
			for _, pl := range p.plugins {
				topics = append(topics, pl.Topics...)
			}
			if _, err := p.kc.CheckTopics(topics...); err != nil {
				return err
			}
			if err := a.checkWrittenTopics(p.kc, p.plugins); err != nil {
				return err
			}
			a.logger.Info("router starting", watermill.LogFields{"dsn": dbx.MaskDSN(a.Config.DB.DSN), "dialect": dbx.DialectOf(p.db), "brokers": p.kc.Brokers,
				"session_timeout": p.kc.SessionTimeout, "rebalance_timeout": p.kc.RebalanceTimeout, "relay": a.Config.Relay.Enabled, "gc": a.gc})
			a.warnRetention(p.kc, topics)
			return nil
		},
	}
}

// metrics builds the registry and the reader of the consumers' lag. That lag leaves out
// transaction markers. The lag metric and the console both read it.
func (p *pipeline) metrics() part {
	return part{name: "metrics",
		start: func(context.Context) error {
			p.m = metrics.New(p.db)
			lags, err := p.kc.NewLagReader()
			if err != nil {
				return err
			}
			p.lags = lags
			p.m.Consumers.JudgeLag(lags)
			p.m.AddLagBound(p.s.Config.Relay.LagBound)
			p.obs = &observer{m: p.m}
			return nil
		},
		stop: func() { p.lags.Close() },
	}
}

// cleaner deletes the inbox's expired done rows. A sweep that fails is logged and made
// again.
func (p *pipeline) cleaner() part {
	var c *inboxops.Cleaner
	return part{name: "cleaner",
		start: func(context.Context) (err error) {
			c, err = inboxops.NewCleaner(p.db, p.s.Config.cleanerConfig(), p.s.logger)
			return BadInput(err)
		},
		run: func(ctx context.Context) error { return c.Run(ctx) },
	}
}

// inbox builds plugin i's handler and its inbox, and its group commit when inbox.batch_size
// is above 1. Stopping it closes the group commit, then the handler when it is an
// io.Closer.
func (p *pipeline) inbox(i int) part {
	var closers []func()
	return part{
		start: func(ctx context.Context) error {
			a, pl := p.s, p.plugins[i]
			ib, closeHandler, err := a.buildInbox(ctx, p.db, pl, p.observer())
			if err != nil {
				return err
			}
			closers = []func(){closeHandler}
			p.inboxes[i] = ib
			p.m.InitBizType(pl.BizType, deliveryOutcomes, redeliveryOutcomes)
			if ib.BreakerEnabled() {
				p.m.SetBreaker(pl.BizType, int(engine.BreakerClosed), time.Time{}, time.Time{}, "")
			}
			p.delivers[i] = func(topic string) kafkax.DeliverFunc { return kafkax.Alone(ib.HandlerFunc(topic)) }
			if bc := a.Config.Inbox.Batch; bc.MaxSize > 1 {
				b, err := ib.NewBatcher(bc)
				if err != nil {
					closeHandler()
					return BadInput(fmt.Errorf("plugin %s: group commit: %w", pl.Name, err))
				}
				closers = append([]func(){func() { _ = b.Close() }}, closers...)
				biz := pl.BizType
				b.ObservePrepares(func(elapsed time.Duration, err error) { p.m.ObservePrepare(biz, elapsed, err) })
				p.m.AddPreparing(biz, func() int64 { return b.Stats().Preparing })
				p.delivers[i] = func(topic string) kafkax.DeliverFunc {
					return func(msg *message.Message, done func(error)) { b.Deliver(msg, topic, done) }
				}
				a.logger.Info("group commit on", watermill.LogFields{"plugin": pl.Name, "batch_size": bc.MaxSize, "batch_workers": bc.Workers})
			}
			return nil
		},
		stop: func() {
			for _, c := range closers {
				c()
			}
		},
	}
}

// redeliverer runs plugin i's delayed redeliveries of inbox.delayed_retries. A look for due
// rows that fails is logged and made again.
func (p *pipeline) redeliverer(i int) part {
	return part{run: func(ctx context.Context) error { return p.inboxes[i].RunRedeliveries(ctx) }}
}

// history adds the deliveries per minute to inbox_history every metrics.HistoryFlushEvery.
// It adds them once more when it stops, which is after the router and the HTTP commands
// stopped.
func (p *pipeline) history() part {
	return part{name: "history",
		run: func(ctx context.Context) error {
			p.m.RunHistory(ctx, metrics.HistoryFlushEvery, func(err error) {
				p.s.logger.Error("inbox history (the console's chart; counts not written are kept for the next flush)", err, nil)
			})
			return nil
		},
	}
}

// router consumes every plugin's topics in the plugin's consumer group, with one Kafka
// subscriber per topic, each read by a loop of its own (kafkax.Consume) that hands its
// messages to the plugin's inbox. Stopping it lets the deliveries in flight finish. It runs
// no Watermill router: a group commit's deliveries (engine.Batcher.Deliver) have no
// goroutine of their own while their batch runs.
func (p *pipeline) router() part {
	var subs []subscription
	return part{name: "router",
		start: func(context.Context) error {
			a := p.s
			budget := kafkax.NewBudget(a.Config.Kafka.Parallel.MaxInFlightBytes) // one for every subscriber of the router
			for i, pl := range p.plugins {
				for _, t := range pl.Topics {
					sub, err := a.subscriber(p.kc, pl.ConsumerGroup, budget)
					if err != nil {
						closeSubscriptions(subs)
						return kafkax.Unreachable(p.kc.Brokers, err)
					}
					subs = append(subs, subscription{name: pl.Name + "/" + t, topic: t, sub: sub, deliver: p.delivers[i](t)})
					if ps, ok := sub.(metrics.PartitionStatsSource); ok { // not with kafka.window 1
						p.m.Consumers.Add(ps)
					}
				}
				a.logger.Info("plugin", watermill.LogFields{"plugin": pl.Name, "topics": pl.Topics, "consumer_group": pl.ConsumerGroup, "biz_type": pl.BizType})
			}
			return nil
		},
		run: func(ctx context.Context) error {
			// A subscription that ends on its own ends the others, and the part fails.
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			errs := make(chan error, len(subs))
			for _, s := range subs {
				go func() {
					err := kafkax.Consume(ctx, s.sub, s.topic, s.name, s.deliver, p.s.logger)
					if err != nil {
						cancel()
					}
					errs <- err
				}()
			}
			var first error
			for range subs {
				if err := <-errs; err != nil && first == nil {
					first = err
				}
			}
			return first
		},
		stop: func() { closeSubscriptions(subs) },
	}
}

// subscription is one topic of one plugin, read by kafkax.Consume.
type subscription struct {
	name    string // plugin/topic
	topic   string
	sub     message.Subscriber
	deliver kafkax.DeliverFunc
}

// closeSubscriptions closes the subscribers of subs.
func closeSubscriptions(subs []subscription) {
	for _, s := range subs {
		_ = s.sub.Close()
	}
}

// buildInbox builds p's handler and its inbox. It is the one handler path that `run`,
// `replay` and `inbox retry` share. The returned func closes the handler when it is an
// io.Closer. Call it once nothing uses the inbox any more.
func (s *Setup) buildInbox(ctx context.Context, db *sql.DB, p Plugin, obs engine.Observer) (*engine.Inbox, func(), error) {
	env := inbox.PluginEnv{DB: db, Logger: s.logger.With(watermill.LogFields{"plugin": p.Name}), Settings: p.settings}
	if o, ok := obs.(*observer); ok && o.m != nil {
		env.ObserveCall = func(step string, elapsed time.Duration, err error) { o.m.ObserveCall(p.Name, step, elapsed, err) }
	}
	h, err := p.Build(ctx, env)
	if err != nil {
		if errors.Is(err, ErrBadInput) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("plugin %s: %w", p.Name, err)
	}
	closeHandler := func() {
		if c, ok := h.(io.Closer); ok {
			if err := c.Close(); err != nil {
				s.logger.Error("plugin handler close", err, watermill.LogFields{"plugin": p.Name})
			}
		}
	}
	var ib *engine.Inbox
	if p.command != nil {
		ib, err = engine.NewCommand(db, h, s.Config.inboxConfig(p.BizType, p.KeyLogField, true), s.logger, obs)
	} else {
		ib, err = engine.New(db, h, s.Config.inboxConfig(p.BizType, p.KeyLogField, false), s.logger, obs)
	}
	if err != nil {
		closeHandler()
		return nil, nil, BadInput(fmt.Errorf("plugin %s: %w", p.Name, err))
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ib.CheckServer(cctx); err != nil {
		closeHandler()
		return nil, nil, fmt.Errorf("plugin %s: %w", p.Name, err)
	}
	return ib, closeHandler, nil
}

// checkWrittenTopics checks at start that every topic the plugins write to exists. Those
// are the topics of Plugin.WrittenTopics, under the plugins' configuration. For a missing
// topic it fails, naming the plugin and the topic, and the router exits with status 1.
// Without the check, the relay would park the events for that topic, and `router outbox ls`
// would list them. relay.check_topics=false skips the check, for topics created after the
// router starts.
func (s *Setup) checkWrittenTopics(kc kafkax.Config, plugins []Plugin) error {
	if !s.Config.Relay.CheckTopics {
		return nil
	}
	for _, p := range plugins {
		topics, err := p.WrittenTopics()
		if err != nil {
			return err
		}
		if len(topics) == 0 {
			continue
		}
		if _, err := kc.CheckTopics(topics...); err != nil {
			if errors.Is(err, kafkax.ErrMissingTopic) {
				return fmt.Errorf("plugin %s writes its events to a topic that does not exist: %w; or set relay.check_topics=false (its events are then parked until it exists)", p.Name, err)
			}
			return err
		}
	}
	return nil
}

// subscriber returns the consumer of a plugin's topic. By default it is the parallel
// subscriber. That one keeps up to kafka.window messages per partition in flight, within
// the router's byte budget. Group commit needs that to fill its batches, and slow calls
// need it to overlap. It cuts values over inbox.max_payload_bytes before they wait. With
// kafka.window 1, the consumer is watermill-kafka's subscriber.
func (s *Setup) subscriber(kc kafkax.Config, group string, budget *kafkax.Budget) (message.Subscriber, error) {
	if s.Config.Kafka.Parallel.Window > 1 {
		return kc.NewParallelSubscriber(group, s.Config.parallelConfig(budget), s.logger)
	}
	return kc.NewSubscriber(group, s.logger)
}

// warnRetention warns when Kafka can replay messages older than the inbox remembers. A
// replayed message whose inbox row was cleaned would be processed again.
func (s *Setup) warnRetention(kc kafkax.Config, topics []string) {
	for _, t := range topics {
		r, err := kc.TopicRetention(t)
		if err != nil {
			s.logger.Info("could not read topic retention", watermill.LogFields{"topic": t, "err": err.Error()})
			continue
		}
		if r < 0 || r > s.Config.Inbox.Retention {
			s.logger.Error("inbox retention is shorter than the topic's: a replay from the oldest offset could re-run cleaned messages",
				fmt.Errorf("topic %s retention %s > inbox.retention %s", t, fmtRetention(r), s.Config.Inbox.Retention),
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

// observer records deliveries in the metrics. After a delivery that committed work, and so
// maybe outbox rows, it wakes this process's relay. The relay then reads the rows at once,
// not at its next poll.
type observer struct {
	m    *metrics.Metrics
	wake func()
}

// BreakerChanged implements engine.BreakerObserver.
func (o *observer) BreakerChanged(biz string, s engine.BreakerStatus) {
	o.m.SetBreaker(biz, int(s.State), s.Since, s.ProbeAt, s.LastError)
}

// Redelivered implements engine.RedeliveryObserver. A redelivery that committed work wakes
// the relay too.
func (o *observer) Redelivered(biz string, r engine.Result) {
	o.m.Redeliveries.WithLabelValues(biz, string(r.Outcome)).Inc()
	if o.wake != nil && r.Outcome == engine.OutcomeProcessed {
		o.wake()
	}
}

func (o *observer) Delivered(biz string, r engine.Result, d time.Duration) {
	o.m.Observe(biz, string(r.Outcome), d)
	if o.wake != nil && r.Outcome == engine.OutcomeProcessed {
		o.wake()
	}
}

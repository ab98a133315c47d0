package onceflowcmd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/health"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/pkg/metrics"
)

func (a *app) runCmd() *cobra.Command {
	var only []string
	var noRelay bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "consume with every registered plugin, relay the outbox, clean the inbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runRouter(cmd.Context(), only, !noRelay && a.cfg.Relay.Enabled)
		},
	}
	cmd.Flags().StringSliceVar(&only, "plugins", nil, "run only these plugins (default: all registered)")
	cmd.Flags().BoolVar(&noRelay, "no-relay", false, "do not run the outbox relay in this process")
	return cmd
}

// selectPlugins returns the plugins to run, failing on unknown names and on configuration
// sections for plugins that are not registered (a typo must not be silently ignored).
func (a *app) selectPlugins(only []string) ([]inbox.Plugin, error) {
	for name := range a.cfg.Plugins {
		if _, ok := inbox.Plugins.Get(name); !ok {
			return nil, badInput(fmt.Errorf("config plugins.%s: no such plugin (registered: %v)", name, inbox.Plugins.Names()))
		}
	}
	names := only
	if len(names) == 0 {
		names = inbox.Plugins.Names()
	}
	var out []inbox.Plugin
	for _, n := range names {
		p, ok := inbox.Plugins.Get(n)
		if !ok {
			return nil, badInput(fmt.Errorf("unknown plugin %q (registered: %v)", n, inbox.Plugins.Names()))
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, badInput(errors.New("no plugins registered"))
	}
	return out, nil
}

func (a *app) runRouter(ctx context.Context, only []string, withRelay bool) error {
	plugins, err := a.selectPlugins(only)
	if err != nil {
		return err
	}
	kc := a.kafka()
	if err := kc.Validate(); err != nil {
		return badInput(err)
	}
	tables := append([]string(nil), coreTables...)
	if withRelay && a.cfg.Relay.Shards > 1 {
		tables = append(tables, outbox.MemberTable) // checked at start, like `router relay` does
	}
	db, err := a.openAppDB(ctx, 0, tables...)
	if err != nil {
		return err
	}
	defer db.Close()
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
	a.logger.Info("router starting", watermill.LogFields{"dsn": dbx.MaskDSN(a.cfg.DB.DSN), "brokers": kc.Brokers,
		"session_timeout": kc.SessionTimeout, "rebalance_timeout": kc.RebalanceTimeout, "relay": withRelay, "gc": a.gc})
	a.warnRetention(kc, topics)

	m := metrics.New(db)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, a.logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(middleware.Recoverer)
	obs := &observer{m: m}
	for _, p := range plugins {
		ib, err := a.buildInbox(db, p, obs)
		if err != nil {
			return err
		}
		handler := ib.HandlerFunc
		if bc := a.cfg.batchConfig(); bc.MaxSize > 1 {
			if b, err := ib.NewBatcher(bc); err == nil {
				defer b.Close() // after the router stopped: its handlers are done
				biz := p.BizType
				b.ObservePrepares(func(elapsed time.Duration, err error) { m.ObservePrepare(biz, elapsed, err) })
				m.AddPreparing(biz, func() int64 { return b.Stats().Preparing })
				handler = b.HandlerFunc
				a.logger.Info("group commit on", watermill.LogFields{"plugin": p.Name, "batch_size": bc.MaxSize, "batch_workers": bc.Workers})
			} else {
				a.logger.Info("group commit off: one delivery per transaction", watermill.LogFields{"plugin": p.Name, "reason": err.Error()})
			}
		}
		for _, t := range p.Topics {
			sub, err := a.subscriber(kc, p.ConsumerGroup)
			if err != nil {
				return kafkax.Unreachable(kc.Brokers, err)
			}
			if ps, ok := sub.(metrics.PartitionStatsSource); ok { // not with kafka.window 1
				m.Consumers.Add(ps)
			}
			router.AddConsumerHandler(p.Name+"/"+t, t, sub, handler(t))
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
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
	cleaner, err := inbox.NewCleaner(db, inbox.CleanerConfig{BatchSize: a.cfg.Inbox.CleanupBatch, Interval: a.cfg.Inbox.CleanupInterval}, a.logger)
	if err != nil {
		return badInput(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); errs <- cleaner.Run(ctx) }()

	stopAdmin, err := a.startAdmin(ctx, db, kc, m)
	if err != nil {
		return err
	}
	defer stopAdmin()

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

// subscriber returns the consumer of a plugin's topic: the parallel one (kafka.window
// messages per partition in flight, which group commit needs to fill its batches) or, with
// kafka.window 1, watermill-kafka's.
func (a *app) subscriber(kc kafkax.Config, group string) (message.Subscriber, error) {
	if a.cfg.Kafka.Window > 1 {
		return kc.NewParallelSubscriber(group, kafkax.ParallelConfig{Window: a.cfg.Kafka.Window}, a.logger)
	}
	return kc.NewSubscriber(group, a.logger)
}

// buildInbox builds p's handler and its inbox: the one handler path that `run`, `replay`
// and `inbox retry` share.
func (a *app) buildInbox(db *sql.DB, p inbox.Plugin, obs inbox.Observer) (*inbox.Inbox, error) {
	raw := a.cfg.Plugins[p.Name]
	env := inbox.PluginEnv{DB: db, Logger: a.logger.With(watermill.LogFields{"plugin": p.Name}),
		DecodeConfig: func(target any) error { return decodePluginConfig(p.Name, raw, target) }}
	if o, ok := obs.(*observer); ok && o.m != nil {
		env.ObserveCall = func(step string, elapsed time.Duration, err error) { o.m.ObserveCall(p.Name, step, elapsed, err) }
	}
	h, err := p.Build(env)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", p.Name, err)
	}
	ib, err := inbox.New(db, h, a.inboxConfig(p), a.logger, obs)
	if err != nil {
		return nil, badInput(fmt.Errorf("plugin %s: %w", p.Name, err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ib.CheckServer(ctx); err != nil {
		return nil, fmt.Errorf("plugin %s: %w", p.Name, err)
	}
	return ib, nil
}

func (a *app) inboxConfig(p inbox.Plugin) inbox.Config {
	return a.cfg.inboxConfig(p.BizType, p.KeyLogField)
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

func (o *observer) Delivered(biz string, r inbox.Result, d time.Duration) {
	o.m.Observe(biz, string(r.Outcome), d)
	if o.wake != nil && r.Outcome == inbox.OutcomeProcessed {
		o.wake()
	}
}

// readiness paces /readyz's background checks: each check runs every Interval, at most
// one call at a time, each call bounded by Timeout.
var readiness = health.Config{Interval: 5 * time.Second, Timeout: 3 * time.Second}

// startAdmin serves /healthz, /readyz and /metrics on a dedicated mux. /readyz answers from
// the latest results of background checks of MariaDB and Kafka (health.Checker), never
// from a check of its own: a request costs no connection and cannot hang on a broker that
// accepts connections and never answers. The returned func stops the server and the checks.
func (a *app) startAdmin(ctx context.Context, db *sql.DB, kc kafkax.Config, m *metrics.Metrics) (func(), error) {
	if a.cfg.Admin.Listen == "" {
		return func() {}, nil
	}
	ready, err := health.New(readiness, a.logger,
		health.Check{Name: "mariadb", Func: db.PingContext},
		health.Check{Name: "kafka", Func: kc.Probe})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("/readyz", ready)
	mux.Handle("/metrics", m.Handler())
	ln, err := net.Listen("tcp", a.cfg.Admin.Listen)
	if err != nil {
		return nil, badInput(fmt.Errorf("admin.listen %s: %w (set admin.listen to a free port, or empty to disable)", a.cfg.Admin.Listen, err))
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	checkCtx, stopChecks := context.WithCancel(ctx)
	checksDone := make(chan struct{})
	go func() { defer close(checksDone); ready.Run(checkCtx) }()
	a.logger.Info("admin listener", watermill.LogFields{"addr": ln.Addr().String()})
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		stopChecks()
		<-checksDone
	}, nil
}

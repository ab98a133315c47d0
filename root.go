package onceflow

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/gcx"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// app carries what every subcommand resolves from flags and configuration.
type app struct {
	configFile string
	cfg        Config
	logger     watermill.LoggerAdapter
	gc         string                           // the garbage collector's settings in effect (gcx.Apply)
	plugins    *registry.Registry[inbox.Plugin] // the binary's plugins (inbox.RegisteredPlugins unless WithPlugins)
}

// Option configures Run.
type Option func(*app)

// WithPlugins makes Run use plugins instead of those registered with inbox.MustRegister: a
// test runs the command line with plugins of its own, as a binary with other imports would.
// It panics on an invalid plugin or a name given twice, as inbox.MustRegister does.
func WithPlugins(plugins ...inbox.Plugin) Option {
	r := pluginRegistry(plugins)
	return func(a *app) { a.plugins = r }
}

// pluginRegistry holds plugins by name, panicking on an invalid plugin or a name given twice.
func pluginRegistry(plugins []inbox.Plugin) *registry.Registry[inbox.Plugin] {
	r := registry.New[inbox.Plugin]("plugin")
	for _, p := range plugins {
		if err := p.Validate(); err != nil {
			panic(err)
		}
		r.MustRegister(p.Name, p)
	}
	return r
}

// commonBindings maps configuration keys to the persistent flags that override them.
var commonBindings = map[string]string{
	"db.dsn":        "dsn",
	"kafka.brokers": "brokers",
	"log.level":     "log-level",
}

// Run runs the router command line on args (without the program name) and returns what
// Main would report; ExitCode maps the error to an exit code.
func Run(ctx context.Context, args []string, opts ...Option) error {
	a := &app{plugins: pluginRegistry(inbox.RegisteredPlugins())}
	for _, o := range opts {
		o(a)
	}
	root := &cobra.Command{
		Use:           "router",
		Short:         "onceflow router: exactly-once effects for Kafka consumers",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := loadConfig(a.configFile, cmd.Flags(), commonBindings, a.declared())
			if err != nil {
				return err
			}
			a.cfg = cfg
			a.logger = newLogger(cfg.Log)
			a.gc = gcx.Apply(cfg.Runtime.GOGC, cfg.Runtime.MemoryLimitMB)
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return BadInput(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFile, "config", "", "config file (default configs/router.yaml if present; env ONCEFLOW_CONFIG)")
	pf.String("dsn", "", "application database DSN (overrides db.dsn)")
	pf.StringSlice("brokers", nil, "Kafka brokers (overrides kafka.brokers)")
	pf.String("log-level", "", "log level (overrides log.level)")

	root.AddCommand(a.runCmd(), a.relayCmd(), a.migrateCmd(), a.produceCmd(), a.verifyCmd(), a.pluginsCmd(), a.replayCmd(), a.inboxCmd(), a.outboxCmd(), a.topicsCmd(), a.configCmd(), a.versionCmd())
	typeArgErrors(root)
	root.SetArgs(args)
	if _, _, err := root.Find(args); err != nil {
		return BadInput(err) // an unknown command
	}
	_, err := root.ExecuteContextC(ctx)
	return err
}

// typeArgErrors makes the argument checks of cmd and its subcommands (a wrong number of
// arguments, a bad value) bad input: exit code 2, as flag errors are (SetFlagErrorFunc).
func typeArgErrors(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error { return BadInput(check(c, args)) }
	}
	for _, sub := range cmd.Commands() {
		typeArgErrors(sub)
	}
}

func newLogger(c LogConfig) watermill.LoggerAdapter {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if c.Format == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	return gateLevels(slog.New(h))
}

// gateLevels is Watermill's adapter of l behind a levelGate.
func gateLevels(l *slog.Logger) watermill.LoggerAdapter {
	return levelGate{LoggerAdapter: watermill.NewSlogLogger(l), l: l}
}

// levelGate drops Debug and Trace messages below the logger's level before Watermill's
// slog adapter turns their fields into attributes (it converts first, then asks the
// level): its router logs every message at Trace, an allocation per message for nothing.
type levelGate struct {
	watermill.LoggerAdapter
	l *slog.Logger
}

func (g levelGate) Debug(msg string, fields watermill.LogFields) {
	if g.l.Enabled(context.Background(), slog.LevelDebug) {
		g.LoggerAdapter.Debug(msg, fields)
	}
}

func (g levelGate) Trace(msg string, fields watermill.LogFields) {
	if g.l.Enabled(context.Background(), watermill.LevelTrace) {
		g.LoggerAdapter.Trace(msg, fields)
	}
}

// Warn logs msg at slog's WARN level, which Watermill's adapter lacks, with the fields of
// With; the outbox relay looks for it.
func (g levelGate) Warn(msg string, fields watermill.LogFields) {
	if g.l.Enabled(context.Background(), slog.LevelWarn) {
		g.l.Warn(msg, slogArgs(fields)...)
	}
}

func (g levelGate) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return levelGate{LoggerAdapter: g.LoggerAdapter.With(fields), l: g.l.With(slogArgs(fields)...)}
}

// slogArgs are fields as slog's key-value arguments, in key order.
func slogArgs(fields watermill.LogFields) []any {
	keys := slices.Sorted(maps.Keys(fields))
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, k, fields[k])
	}
	return args
}

func (a *app) kafka() kafkax.Config { return a.cfg.kafkaConfig() }

// dbConfig is the pool config of dsn: db.dsn's (admin false) or db.admin_dsn's, with that
// user's password from db.password / db.admin_password (or their files) and db.tls.*. It
// opens nothing.
func (a *app) dbConfig(dsn string, admin bool) (*dbx.Config, error) {
	key := "db.dsn"
	if admin {
		key = "db.admin_dsn"
	}
	if dsn == "" {
		return nil, BadInput(fmt.Errorf("%s is empty: set it (config file, env %s), e.g. onceflow@tcp(127.0.0.1:3306)/onceflow with the password in db.password_file; no DSN is built in",
			key, envName(key)))
	}
	if _, err := dbx.ParseDSNInfo(dsn); err != nil {
		return nil, BadInput(fmt.Errorf("%s: %w", key, err))
	}
	pw, err := a.cfg.DB.password(admin)
	if err != nil {
		return nil, BadInput(err)
	}
	dc := a.cfg.DB.Config
	dc.DSN, dc.Password = dsn, pw
	return &dc, nil
}

// openAppDB opens the application database (pool of maxConns, 0 = db.max_open_conns) and
// checks that the given tables exist, so a missing migration is one clear error up front.
func (a *app) openAppDB(ctx context.Context, maxConns int, tables ...string) (*sql.DB, error) {
	dc, err := a.dbConfig(a.cfg.DB.DSN, false)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		dc.MaxOpenConns = maxConns
	}
	db, err := dbx.Open(ctx, *dc)
	if err != nil {
		return nil, err
	}
	if err := checkTables(ctx, db, tables...); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// checkTables checks that the tables exist and are readable.
func checkTables(ctx context.Context, db *sql.DB, tables ...string) error {
	for _, t := range tables {
		if _, err := db.ExecContext(ctx, "SELECT 1 FROM "+t+" LIMIT 0"); err != nil {
			return fmt.Errorf("table %s is missing or unreadable: %w (run `router migrate`)", t, err)
		}
	}
	return nil
}

// frameworkTables are the framework's tables every command that runs plugins needs; each
// plugin adds its own (inbox.Plugin.Tables).
var frameworkTables = []string{"inbox", "inbox_call", "inbox_response", "outbox"}

func printf(format string, args ...any) { fmt.Fprintf(os.Stdout, format, args...) }

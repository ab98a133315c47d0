package onceflow

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/spf13/pflag"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/gcx"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Setup is the runtime as one command of a router binary sets it up: the configuration read
// from a file, the environment and flags, the logger it asks for, and the binary's plugins
// under it. The router's command line (pkg/routercmd) builds one with LoadSetup for each
// command and runs the command with its methods; a team's own tools can do the same. Its
// methods open what they are asked for and nothing else.
type Setup struct {
	// Config is the configuration LoadSetup read and checked. A change made to it afterwards
	// is not checked again: the command line turns the relay off with it (router run
	// --no-relay) and names the privileged DSN (router migrate --admin-dsn).
	Config Config

	file    string                           // the config file read, "" for none
	logger  watermill.LoggerAdapter          // log.*'s
	gc      string                           // the garbage collector's settings in effect (gcx.Apply)
	plugins *registry.Registry[inbox.Plugin] // the binary's plugins; nil in a Runtime built by New
}

// Source is where LoadSetup reads the configuration. Flags win over the environment
// (ONCEFLOW_*), which wins over the file, which wins over the defaults.
type Source struct {
	// File is the config file (.yaml, .yml, .json or .toml). Empty: $ONCEFLOW_CONFIG, else
	// configs/router.yaml when the working directory has it, else none.
	File string
	// Flags are the command line's flags, and FlagKeys maps a setting's key to the name of
	// the flag in Flags that overrides it when given ("db.dsn": "dsn"). Both may be nil.
	Flags    *pflag.FlagSet
	FlagKeys map[string]string
}

// LoadSetup reads the configuration from src for a binary whose plugins are plugins, and
// builds its logger (log.*). It checks everything that can be checked before anything
// connects: unknown keys, invalid values and ONCEFLOW_ variables that name no setting are
// refused, and so is a plugin's section that its plugin refuses, all as bad input
// (ErrBadInput). It sets the process's garbage collector as runtime.* asks, unless GOGC or
// GOMEMLIMIT in the environment do. A plugin that is not valid, or a name given twice, is an
// error too.
func LoadSetup(src Source, plugins []inbox.Plugin) (*Setup, error) {
	reg, err := pluginRegistry(plugins)
	if err != nil {
		return nil, err
	}
	s := &Setup{file: configFile(src.File), plugins: reg}
	cfg, _, err := loadConfig(src.File, src.Flags, src.FlagKeys, s.declared())
	if err != nil {
		return nil, err
	}
	s.Config = cfg
	s.logger = newLogger(cfg.Log)
	s.gc = gcx.Apply(cfg.Runtime.GOGC, cfg.Runtime.MemoryLimitMB)
	return s, nil
}

// ConfigFile is the config file the configuration was read from; "" when none was (the
// defaults and the environment).
func (s *Setup) ConfigFile() string { return s.file }

// Logger is the logger of log.*: slog's text or JSON handler on stderr, through Watermill's
// adapter.
func (s *Setup) Logger() watermill.LoggerAdapter { return s.logger }

// Kafka is the Kafka clients' configuration: kafka.* under the router's client id, with the
// defaults of the settings left zero.
func (s *Setup) Kafka() kafkax.Config { return s.Config.kafkaConfig() }

// DBConfig is the pool configuration of db.dsn, or with admin of db.admin_dsn (the
// privileged DSN of migrations), with that user's password from db.password or
// db.admin_password (or their files) and db.tls.*. It opens nothing. An empty or malformed
// DSN and an unreadable password file are bad input.
func (s *Setup) DBConfig(admin bool) (dbx.Config, error) {
	key, dsn := "db.dsn", s.Config.DB.DSN
	if admin {
		key, dsn = "db.admin_dsn", s.Config.DB.AdminDSN
	}
	if dsn == "" {
		return dbx.Config{}, BadInput(fmt.Errorf("%s is empty: set it (config file, env %s), e.g. onceflow@tcp(127.0.0.1:3306)/onceflow with the password in db.password_file; no DSN is built in",
			key, envName(key)))
	}
	if _, err := dbx.ParseDSNInfo(dsn); err != nil {
		return dbx.Config{}, BadInput(fmt.Errorf("%s: %w", key, err))
	}
	pw, err := s.Config.DB.password(admin)
	if err != nil {
		return dbx.Config{}, BadInput(err)
	}
	dc := s.Config.DB.Config
	dc.DSN, dc.Password = dsn, pw
	return dc, nil
}

// OpenDB opens the application database (DBConfig) with a pool of maxConns connections (0:
// db.max_open_conns) and checks that tables exist, so that a missing migration is one clear
// error up front.
func (s *Setup) OpenDB(ctx context.Context, maxConns int, tables ...string) (*sql.DB, error) {
	dc, err := s.DBConfig(false)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		dc.MaxOpenConns = maxConns
	}
	db, err := dbx.Open(ctx, dc)
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

// Check checks, connecting to nothing, what the commands that connect check first: every
// section of plugins.* names a plugin of the binary, every plugin resolves under its section
// and says which topics it writes to, and the configurations of the pools (of db.dsn and
// db.admin_dsn, each when it is set), of the relay and of the Kafka clients are valid.
// LoadSetup checked the rest. Its errors are bad input.
func (s *Setup) Check() error {
	if err := s.CheckSections(); err != nil {
		return err
	}
	ps, err := s.Plugins()
	if err != nil {
		return err
	}
	for _, p := range ps {
		if _, err := p.WrittenTopics(); err != nil {
			return err
		}
	}
	if s.Config.DB.DSN != "" {
		if _, err := s.DBConfig(false); err != nil {
			return err
		}
		if _, err := s.relayConfig(); err != nil {
			return err
		}
	}
	if s.Config.DB.AdminDSN != "" {
		if _, err := s.DBConfig(true); err != nil {
			return err
		}
	}
	if kc := s.Kafka(); kc.Validate() != nil {
		return BadInput(kc.Validate())
	}
	return nil
}

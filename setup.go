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

// Setup is the runtime as one command of a router binary sets it up. It holds the
// configuration read from a file, the environment and flags. It holds the logger that the
// configuration asks for, and the binary's plugins. The router's command line, package
// pkg/routercmd, builds a Setup with LoadSetup for each command. The command then runs with
// the Setup's methods, and a team's own tools can do the same. Each method opens what it is
// asked for and nothing else.
type Setup struct {
	// Config is the configuration LoadSetup read and checked. A change made to it
	// afterwards is not checked again. The command line changes it in two places. `router
	// run --no-relay` turns the relay off, and `router migrate --admin-dsn` names the
	// privileged DSN.
	Config Config

	file    string                           // the config file read, or "" for none
	logger  watermill.LoggerAdapter          // the logger of log.*
	gc      string                           // the garbage collector's settings in effect, from gcx.Apply
	plugins *registry.Registry[inbox.Plugin] // the binary's plugins, nil in a Runtime built by New
}

// Source is where LoadSetup reads the configuration. Flags win over the ONCEFLOW_
// environment variables, which win over the file, which wins over the defaults.
type Source struct {
	// File is the config file, of type .yaml, .yml, .json or .toml. When File is empty,
	// LoadSetup reads the file $ONCEFLOW_CONFIG names. Without that variable, it reads
	// configs/router.yaml when the working directory has one, and else no file.
	File string
	// Flags are the command line's flags. FlagKeys maps a setting's key to the name of the
	// flag in Flags that overrides it when given, such as "db.dsn" to "dsn". Both may be
	// nil.
	Flags    *pflag.FlagSet
	FlagKeys map[string]string
}

// LoadSetup reads the configuration from src for a binary with the given plugins. It builds
// the logger of log.*. It checks everything that can be checked before anything connects.
// It refuses unknown keys, invalid values and ONCEFLOW_ variables that name no setting. It
// also refuses a plugin's section that the plugin refuses. All of these refusals are bad
// input, matching ErrBadInput. LoadSetup sets the process's garbage collector as runtime.*
// asks, unless GOGC or GOMEMLIMIT in the environment do. A plugin that is not valid, or a
// plugin name given twice, is an error too.
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

// ConfigFile is the config file the configuration was read from. It is "" when the
// configuration came from the defaults and the environment alone.
func (s *Setup) ConfigFile() string { return s.file }

// Logger is the logger of log.*. It is slog's text or JSON handler on stderr, behind
// Watermill's adapter.
func (s *Setup) Logger() watermill.LoggerAdapter { return s.logger }

// Kafka is the Kafka clients' configuration. It is kafka.* under the router's client id,
// with defaults for the settings left zero.
func (s *Setup) Kafka() kafkax.Config { return s.Config.kafkaConfig() }

// DBConfig is the pool configuration of db.dsn. With admin, it is that of db.admin_dsn, the
// privileged DSN of migrations. The password is that user's, from db.password or
// db.admin_password, or from the file of either. TLS comes from db.tls.*. DBConfig opens
// nothing. An empty or malformed DSN and an unreadable password file are bad input.
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

// OpenDB opens the application database of DBConfig with a pool of maxConns connections. A
// maxConns of 0 means db.max_open_conns. OpenDB then checks that tables exist, so that a
// missing migration is one clear error up front.
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

// frameworkTables are the framework's tables that every command running plugins needs. Each
// plugin adds its own, listed in inbox.Plugin.Tables.
var frameworkTables = []string{"inbox", "inbox_call", "inbox_response", "outbox"}

// Check checks what the commands that connect check first, and connects to nothing. Every
// section of plugins.* must name a plugin of the binary. Every plugin must resolve under
// its section and say which topics it writes to. The Kafka clients' configuration must be
// valid. So must the pool's of db.dsn and the relay's when db.dsn is set, and the pool's of
// db.admin_dsn when that is set. LoadSetup checked the rest. Check's errors are bad input.
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

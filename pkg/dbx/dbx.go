// Package dbx holds the small database building blocks shared by inbox, outbox and plugins:
// opening a pool with safe defaults (MariaDB, MySQL 8 or PostgreSQL, chosen from the DSN),
// the pool's SQL dialect, running a function in a transaction, and classifying driver
// errors.
package dbx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/settings"
)

// Config describes one connection pool. The tags declare the stock router's db.* settings
// (internal/settings): key, default, range and help.
type Config struct {
	// DSN is go-sql-driver's (user:pass@tcp(host:port)/db?params) for MariaDB and MySQL,
	// a postgres://user:pass@host:port/db URL for PostgreSQL.
	DSN string `key:"dsn" help:"application DSN (least privilege): user@tcp(host:port)/db for MariaDB/MySQL (tcp(a:p,b:p,c:p): a Galera cluster, written through the first Synced node until it fails), postgres://user@host:port/db for PostgreSQL; required (no built-in credentials)"`
	// Dialect forces the SQL dialect (mariadb, mysql8, postgres); empty: postgres for a
	// postgres:// DSN, else mariadb or mysql8 by the server's version.
	Dialect string `key:"dialect" help:"SQL dialect: mariadb, mysql8 or postgres; empty: from the DSN and the server's version (mysql8 on a MariaDB server runs MySQL 8's SQL there)"`
	// Password replaces the DSN's password when set (from a file or the environment, so the
	// DSN in a config file carries none).
	Password        string        `key:"password" help:"password of db.dsn's user, replacing the DSN's; better from ONCEFLOW_DB_PASSWORD or db.password_file"`
	MaxOpenConns    int           `key:"max_open_conns" default:"32" range:"1..1000" help:"connection pool size"`
	MaxIdleConns    int           // default MaxOpenConns
	ConnMaxLifetime time.Duration // default 5m
	PingTimeout     time.Duration // default 5s
	TLS             TLS           `key:"tls"` // TLS to the server; off unless a field is set
}

// WithDefaults returns c with its zero settings set to their defaults, as Open uses it; the
// stock router's db.* defaults are these values.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Validate reports a setting outside its range; it only checks (WithDefaults first).
func (c Config) Validate() error {
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	d, err := ParseDialect(c.Dialect)
	if err != nil {
		return err
	}
	if (d == Postgres) != IsPostgresDSN(c.DSN) && d != "" && c.DSN != "" {
		return fmt.Errorf("db.dialect %s does not match db.dsn %q", d, MaskDSN(c.DSN))
	}
	return nil
}

func (c *Config) setDefaults() {
	settings.SetDefaults(c)
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = c.MaxOpenConns
	}
	if c.ConnMaxLifetime == 0 {
		c.ConnMaxLifetime = 5 * time.Minute
	}
	if c.PingTimeout == 0 {
		c.PingTimeout = 5 * time.Second
	}
}

// ParseDSN validates a DSN and returns the driver config with the settings onceflow relies
// on: parseTime, UTC, interpolated parameters, times truncated to microseconds,
// multiStatements refused.
func ParseDSN(dsn string) (*mysql.Config, error) {
	mc, err := ParseDriverDSN(dsn)
	if err != nil {
		return nil, err
	}
	if mc.MultiStatements {
		return nil, fmt.Errorf("bad database dsn %q: multiStatements=true is refused", MaskDSN(dsn))
	}
	if mc.DBName == "" {
		return nil, fmt.Errorf("bad database dsn %q: no database name after the slash", MaskDSN(dsn))
	}
	mc.ParseTime = true
	mc.Loc = time.UTC
	if mc.Params == nil {
		mc.Params = map[string]string{}
	}
	// Interpolating parameters client-side halves the round trips of every statement (no
	// server-side prepare/close per call). The driver refuses it for multibyte charsets where
	// escaping would be unsafe; onceflow uses utf8mb4, where it is safe. A DSN may still say
	// interpolateParams=false.
	if !hasParam(dsn, "interpolateParams") {
		mc.InterpolateParams = true
	}
	// Time parameters to microseconds, the precision of DATETIME(6): Go's nanoseconds made
	// MariaDB read a literal such as '2026-12-03 14:05:00.123456789' as a string it cannot
	// use to narrow an index, so `created_at >= ?` scanned the biz type instead of reading
	// a range (inbox/store_plan_test.go). A DSN may still set timeTruncate.
	if !hasParam(dsn, "timeTruncate") {
		if err := mc.Apply(mysql.TimeTruncate(time.Microsecond)); err != nil {
			return nil, fmt.Errorf("bad database dsn %q: %w", MaskDSN(dsn), err)
		}
	}
	if _, ok := mc.Params["time_zone"]; !ok {
		mc.Params["time_zone"] = "'+00:00'"
	}
	// READ COMMITTED for the whole session, set once per connection: a per-transaction
	// isolation level costs a SET statement (a round trip) before every BEGIN. Open checks
	// that the server applied it. (tx_isolation: MariaDB 10.11's name for it.)
	_, mysqlName := mc.Params["transaction_isolation"]
	if _, ok := mc.Params["tx_isolation"]; !ok && !mysqlName {
		mc.Params["tx_isolation"] = "'READ-COMMITTED'"
	}
	if mc.Timeout == 0 {
		mc.Timeout = 5 * time.Second
	}
	return mc, nil
}

// DriverConfig is ParseDSN's driver config with cfg's Password and TLS applied (the TLS
// settings registered with the driver, RegisterTLS).
func (cfg Config) DriverConfig() (*mysql.Config, error) {
	mc, err := ParseDSN(cfg.DSN)
	if err != nil {
		return nil, err
	}
	if cfg.Password != "" {
		mc.Passwd = cfg.Password
	}
	if cfg.TLS.Enabled() {
		if mc.TLSConfig != "" && mc.TLSConfig != "false" {
			return nil, fmt.Errorf("database dsn %q sets tls=%s and db.tls.* is set too: use one", MaskDSN(cfg.DSN), mc.TLSConfig)
		}
		name, err := RegisterTLS(cfg.TLS)
		if err != nil {
			return nil, err
		}
		mc.TLSConfig, mc.TLS = name, nil
	}
	return mc, nil
}

// Open opens and pings a pool: pgx's database/sql driver for a postgres:// DSN,
// go-sql-driver/mysql otherwise. The error names the server and says how to start it. The
// pool's dialect (DialectOf) is db.dialect, else the DSN's and the server's.
func Open(ctx context.Context, cfg Config) (*sql.DB, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if IsPostgresDSN(cfg.DSN) {
		return openPostgres(ctx, cfg)
	}
	mc, err := cfg.DriverConfig()
	if err != nil {
		return nil, err
	}
	conn, err := NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("database dsn: %w", err)
	}
	if Dialect(cfg.Dialect) == MySQL8 {
		conn = mysql8Connector{conn}
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxIdleConns)
	db.SetConnMaxLifetime(cfg.ConnMaxLifetime)
	pctx, cancel := context.WithTimeout(ctx, cfg.PingTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errUnknownVariable && mc.Params["tx_isolation"] == "'READ-COMMITTED'" && !hasParam(cfg.DSN, "tx_isolation") {
			// MySQL 8 names the session's isolation transaction_isolation (MariaDB 10.11
			// only tx_isolation): the same pool with MySQL's name.
			cfg.DSN = withParam(cfg.DSN, "transaction_isolation", "%27READ-COMMITTED%27")
			return Open(ctx, cfg)
		}
		if errors.As(err, &me) { // the server answered: refused, not unreachable
			return nil, fmt.Errorf("database %s/%s: %w", mc.Addr, mc.DBName, err)
		}
		return nil, fmt.Errorf("database %s/%s unreachable: %w (start it with `scripts/infra.sh up`)", mc.Addr, mc.DBName, err)
	}
	d := Dialect(cfg.Dialect)
	if d == "" {
		if d, err = serverDialect(pctx, db); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("database %s/%s: %w", mc.Addr, mc.DBName, err)
		}
	}
	setDialect(db, d)
	if iso, err := SessionIsolation(pctx, db); err != nil || iso != ReadCommitted {
		_ = db.Close()
		return nil, fmt.Errorf("database %s/%s: %w: session isolation is %q (%v): leave tx_isolation out of the dsn", mc.Addr, mc.DBName, ErrIsolation, iso, err)
	}
	if d.MySQLFamily() && !hasParam(cfg.DSN, "wsrep_sync_wait") && isGalera(pctx, db) {
		// Galera: a node may not have applied what another one committed yet. Every read
		// of the pool's sessions (the relay's unpublished rows, its lease, the inbox's
		// rows) waits until the node has applied all that the cluster committed before it
		// (causal reads); writes are checked by certification anyway. Set in the DSN, so
		// that it costs no statement per connection; a single server never reads it.
		_ = db.Close()
		cfg.DSN = withParam(cfg.DSN, "wsrep_sync_wait", "1")
		return Open(ctx, cfg)
	}
	return db, nil
}

// NewConnector is go-sql-driver's connector for mc, a failover connector when its address
// lists several servers (ParseDSN's tcp(a,b,c)): for pools opened without Open's checks.
func NewConnector(mc *mysql.Config) (driver.Connector, error) {
	if addrs := ServerAddrs(mc.Addr); mc.Net == "tcp" && len(addrs) > 1 {
		return newFailoverConnector(mc, addrs)
	}
	return mysql.NewConnector(mc)
}

// isGalera reports a server replicating with Galera (@@wsrep_on; MySQL has no such
// variable: not Galera).
func isGalera(ctx context.Context, db *sql.DB) bool {
	var on int
	return db.QueryRowContext(ctx, "SELECT @@wsrep_on").Scan(&on) == nil && on == 1
}

// TxOptions are the options every onceflow transaction uses. Its isolation is READ
// COMMITTED, which keeps InnoDB from taking gap locks, so the inbox and outbox never block
// unrelated inserts; pools opened by Open set it for the session (checked at Open), so
// the options leave the level at the session's and no SET precedes each BEGIN. A pool
// opened otherwise is checked by InTx the first time it sees it (CheckIsolation).
var TxOptions = &sql.TxOptions{}

// InTx runs fn in a READ COMMITTED transaction and commits it. A failure of fn rolls back;
// a failed rollback is joined to fn's error; a failed commit is returned as such (never
// swallowed), wrapping ErrCommitUnknown when the COMMIT got no answer from the server.
//
// The first time InTx sees a pool it checks that its sessions run at READ COMMITTED
// (CheckIsolation, one query per pool and process) and refuses to begin, with an error
// wrapping ErrIsolation, until they do: a pool left at REPEATABLE READ, MariaDB's default,
// never runs an onceflow transaction. (Setting the level on each transaction instead would
// cost a SET, a round trip, before every BEGIN.)
func InTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	if err := checkPool(ctx, db); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	tx, err := db.BeginTx(ctx, TxOptions)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		if rbErr := tx.Rollback(); rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) {
			return errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		if commitUnknown(err) {
			return fmt.Errorf("commit: %w: %w", ErrCommitUnknown, err)
		}
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// ErrCommitUnknown is wrapped by InTx's error when the COMMIT was sent and no answer came
// back (the connection broke while it ran): the transaction may have committed or not, and
// only a later read tells.
var ErrCommitUnknown = errors.New("the outcome of the commit is unknown")

// commitUnknown reports whether a failed Commit may still have committed: not when the
// server answered with an error, nor when database/sql rolled back before sending COMMIT
// (the context was done, or the transaction was already over).
func commitUnknown(err error) bool {
	var me *mysql.MySQLError
	return !errors.As(err, &me) && pgCode(err) == "" && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, sql.ErrTxDone)
}

// MySQL error numbers onceflow reacts to.
const (
	ErLockWaitTimeout = 1205
	ErLockDeadlock    = 1213
	ErDupEntry        = 1062
)

// IsLockConflict reports a deadlock or lock-wait timeout (PostgreSQL: a deadlock, a
// serialization failure or lock_timeout): the transaction was rolled back by the server and
// may simply be run again. Galera's certification failure (a write set that conflicts with
// one another node committed first) is a deadlock error too, at any statement or at COMMIT.
func IsLockConflict(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == ErLockDeadlock || me.Number == ErLockWaitTimeout
	}
	switch pgCode(err) {
	case pgDeadlockDetected, pgSerializationFailure, pgLockNotAvailable:
		return true
	}
	return false
}

// IsDuplicate reports a unique-key violation.
func IsDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == ErDupEntry || pgCode(err) == pgUniqueViolation
}

// IsAccessDenied reports a statement the server refused for want of a privilege (MySQL
// 1142, PostgreSQL 42501).
func IsAccessDenied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1142 || pgCode(err) == "42501"
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// CheckIdent validates an identifier that reaches SQL text (a table name). Values are
// always bound parameters; identifiers cannot be, so they are checked instead.
func CheckIdent(kind, s string) error {
	if !identRe.MatchString(s) {
		return fmt.Errorf("invalid %s %q: must match %s", kind, s, identRe)
	}
	return nil
}

// IsConnError reports an error that means the server could not be reached or the
// connection broke: retrying later may succeed, and the handler is not at fault.
func IsConnError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) {
		return true
	}
	// Galera: the node is not part of the primary component or not ready yet; another
	// node (a new connection) may take the statement.
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == ErWsrepNotReady
	}
	// pgx: the connection broke, or was closed by pgx after a failed read, while a
	// statement (a COMMIT, say) ran.
	if errors.Is(err, pgconn.ErrConnClosed) || pgCode(err) == "" && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe)
}

// CreateDatabase creates the DSN's database if it does not exist (privileged DSN only).
func CreateDatabase(ctx context.Context, dsn string) error {
	return EnsureDatabase(ctx, Config{DSN: dsn})
}

// EnsureDatabase creates the database of cfg's DSN if it does not exist, connected as cfg
// says (password, TLS); privileged users only.
func EnsureDatabase(ctx context.Context, cfg Config) error {
	if IsPostgresDSN(cfg.DSN) {
		return ensurePostgresDatabase(ctx, cfg)
	}
	mc, err := cfg.DriverConfig()
	if err != nil {
		return err
	}
	name := mc.DBName
	if err := CheckIdent("database name", name); err != nil {
		return err
	}
	mc.DBName = ""
	conn, err := NewConnector(mc)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+name); err != nil {
		if IsConnError(err) {
			return fmt.Errorf("database %s unreachable: %w (start it with `scripts/infra.sh up`)", mc.Addr, err)
		}
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// Account logs in as cfg says without choosing a database (so it works before any grant on
// one) and returns the account the server matched (CURRENT_USER()), quoted for GRANT:
// `user`@`host`, e.g. `onceflow`@`127.0.0.1` or `onceflow`@`%`.
func Account(ctx context.Context, cfg Config) (string, error) {
	if IsPostgresDSN(cfg.DSN) {
		return postgresAccount(ctx, cfg)
	}
	mc, err := cfg.DriverConfig()
	if err != nil {
		return "", err
	}
	mc.DBName = ""
	conn, err := NewConnector(mc)
	if err != nil {
		return "", err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var cur string
	if err := db.QueryRowContext(ctx, "SELECT CURRENT_USER()").Scan(&cur); err != nil {
		if IsConnError(err) {
			return "", fmt.Errorf("database %s unreachable: %w (start it with `scripts/infra.sh up`)", mc.Addr, err)
		}
		return "", fmt.Errorf("log in as %s: %w", mc.User, err)
	}
	i := strings.LastIndexByte(cur, '@')
	if i < 0 {
		return "", fmt.Errorf("current user %q has no host part", cur)
	}
	q := func(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }
	return q(cur[:i]) + "@" + q(cur[i+1:]), nil
}

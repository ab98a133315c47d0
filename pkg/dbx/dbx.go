// Package dbx holds the small database building blocks shared by inbox, outbox and plugins.
// It opens a pool with safe defaults on MariaDB, MySQL 8 or PostgreSQL, chosen from the DSN.
// It knows the pool's SQL dialect, runs a function in a transaction and classifies driver
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
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/settings"
)

// Config describes one connection pool. The tags declare the stock router's db.* settings
// with their key, default, range and help, as internal/settings reads them.
type Config struct {
	// DSN is a go-sql-driver DSN for MariaDB and MySQL, such as
	// user:pass@tcp(host:port)/db?params. For PostgreSQL it is a URL such as
	// postgres://user:pass@host:port/db.
	DSN string `key:"dsn" help:"application DSN (least privilege): user@tcp(host:port)/db for MariaDB/MySQL (tcp(a:p,b:p,c:p): a Galera cluster, written through the first Synced node until it fails), postgres://user@host:port/db for PostgreSQL; required (no built-in credentials)"`
	// Dialect forces the SQL dialect to mariadb, mysql8 or postgres. When it is empty, a
	// postgres:// DSN gives postgres, and the server's version picks mariadb or mysql8 for
	// the others.
	Dialect string `key:"dialect" help:"SQL dialect: mariadb, mysql8 or postgres; empty: from the DSN and the server's version (mysql8 on a MariaDB server runs MySQL 8's SQL there)"`
	// Password replaces the DSN's password when set. It comes from a file or the
	// environment, so the DSN in a config file carries none.
	Password     string `key:"password" help:"password of db.dsn's user, replacing the DSN's; better from ONCEFLOW_DB_PASSWORD or db.password_file"`
	MaxOpenConns int    `key:"max_open_conns" default:"32" range:"1..1000" help:"connection pool size"`
	// IdleTxTimeout makes the server end a session whose open transaction has waited this
	// long for its next statement. Its transaction rolls back and its locks go, so a frozen
	// or stalled process never holds them for longer. Open sets it on every connection:
	// MariaDB's idle_transaction_timeout, in whole seconds rounded up, and PostgreSQL's
	// idle_in_transaction_session_timeout. MySQL 8 has no such variable and goes without.
	// It must exceed every legitimate pause inside a transaction. The longest of onceflow's
	// is a plugin's Handle, which inbox.handler_timeout bounds. NoIdleTxTimeout, or any
	// negative value, turns it off. The zero value stands for the default.
	IdleTxTimeout   time.Duration `key:"idle_tx_timeout" default:"30s" range:"0..24h" zero:"-1ns" help:"the server ends a session whose transaction waits this long for its next statement, rolling it back and releasing its locks (a frozen process); no shorter than inbox.handler_timeout; 0 turns it off"`
	MaxIdleConns    int           // default MaxOpenConns
	ConnMaxLifetime time.Duration // default 5m
	PingTimeout     time.Duration // default 5s
	TLS             TLS           `key:"tls"` // TLS to the server; off unless a field is set

	noIdleVar bool // the server has no idle transaction timeout variable (MySQL 8)
}

// NoIdleTxTimeout as Config.IdleTxTimeout sets no idle transaction timeout. Any negative
// value does. The zero value stands for the default.
const NoIdleTxTimeout time.Duration = -1

// WithDefaults returns c with its zero settings set to their defaults, as Open uses it. The
// stock router's db.* defaults are these values.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Validate reports a setting outside its range. It only checks, so call WithDefaults first.
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
	if c.IdleTxTimeout < 0 {
		c.IdleTxTimeout = NoIdleTxTimeout
	}
}

// idleTimeoutVar is MariaDB's session variable that ends a session idle in a transaction.
const idleTimeoutVar = "idle_transaction_timeout"

// idleTimeoutSeconds is d in MariaDB's unit, whole seconds, rounded up.
func idleTimeoutSeconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// ParseDSN validates a DSN and returns the driver config with the settings onceflow relies
// on. They are parseTime, UTC, interpolated parameters and times truncated to
// microseconds. ParseDSN refuses multiStatements.
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
	// Interpolating parameters client-side halves the round trips of every statement,
	// because no call needs a server-side prepare and close. The driver refuses it for
	// multibyte charsets where escaping would be unsafe. onceflow uses utf8mb4, where it is
	// safe. A DSN may still say interpolateParams=false.
	if !hasParam(dsn, "interpolateParams") {
		mc.InterpolateParams = true
	}
	// Time parameters are truncated to microseconds, the precision of DATETIME(6). MariaDB
	// reads a literal with nanoseconds, such as '2026-12-03 14:05:00.123456789', as a string
	// that cannot narrow an index. `created_at >= ?` would then scan the biz type instead of
	// reading a range. inbox/store_plan_test.go checks the plan. A DSN may still set
	// timeTruncate.
	if !hasParam(dsn, "timeTruncate") {
		if err := mc.Apply(mysql.TimeTruncate(time.Microsecond)); err != nil {
			return nil, fmt.Errorf("bad database dsn %q: %w", MaskDSN(dsn), err)
		}
	}
	if _, ok := mc.Params["time_zone"]; !ok {
		mc.Params["time_zone"] = "'+00:00'"
	}
	// READ COMMITTED is set once per connection, for the whole session. A per-transaction
	// isolation level would cost a SET statement, a round trip, before every BEGIN. Open
	// checks that the server applied it. MariaDB 10.11 names the variable tx_isolation.
	_, mysqlName := mc.Params["transaction_isolation"]
	if _, ok := mc.Params["tx_isolation"]; !ok && !mysqlName {
		mc.Params["tx_isolation"] = "'READ-COMMITTED'"
	}
	if mc.Timeout == 0 {
		mc.Timeout = 5 * time.Second
	}
	return mc, nil
}

// DriverConfig is ParseDSN's driver config with cfg's Password and TLS applied. RegisterTLS
// registers the TLS settings with the driver.
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

// Open opens and pings a pool. It uses pgx's database/sql driver for a postgres:// DSN, and
// go-sql-driver/mysql otherwise. Its error names the server and says how to start it. The
// pool's dialect, which DialectOf returns, is db.dialect. Without one, the DSN and the
// server decide it.
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
	// The variable goes in the DSN's parameters, which the driver sets with one SET as it
	// connects, so it costs no round trip of its own.
	if cfg.IdleTxTimeout > 0 && Dialect(cfg.Dialect) != MySQL8 && !cfg.noIdleVar && !hasParam(cfg.DSN, idleTimeoutVar) {
		mc.Params[idleTimeoutVar] = idleTimeoutSeconds(cfg.IdleTxTimeout)
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
			// MySQL 8 names the session's isolation transaction_isolation, and MariaDB 10.11
			// only tx_isolation. Open the same pool with MySQL's name.
			cfg.DSN = withParam(cfg.DSN, "transaction_isolation", "%27READ-COMMITTED%27")
			return Open(ctx, cfg)
		}
		if errors.As(err, &me) && me.Number == errUnknownVariable && strings.Contains(me.Message, idleTimeoutVar) && mc.Params[idleTimeoutVar] != "" && !hasParam(cfg.DSN, idleTimeoutVar) {
			// MySQL 8 has no idle transaction timeout. Open the same pool without it.
			cfg.noIdleVar = true
			return Open(ctx, cfg)
		}
		if errors.As(err, &me) { // the server answered, so it refused and is not unreachable
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
		// On Galera a node may not have applied yet what another one committed. With
		// causal reads, every read of the pool's sessions waits until the node has applied
		// all that the cluster committed before it. Such reads are the relay's unpublished
		// rows, its lease and the inbox's rows. Certification checks the writes anyway. The
		// setting goes in the DSN, so it costs no statement per connection. A single server
		// never reads it.
		_ = db.Close()
		cfg.DSN = withParam(cfg.DSN, "wsrep_sync_wait", "1")
		return Open(ctx, cfg)
	}
	return db, nil
}

// NewConnector is go-sql-driver's connector for mc. When mc's address lists several
// servers, as tcp(a,b,c) does, it is a failover connector. It serves pools opened without
// Open's checks.
func NewConnector(mc *mysql.Config) (driver.Connector, error) {
	if addrs := ServerAddrs(mc.Addr); mc.Net == "tcp" && len(addrs) > 1 {
		return newFailoverConnector(mc, addrs)
	}
	return mysql.NewConnector(mc)
}

// isGalera reports a server replicating with Galera, by @@wsrep_on. MySQL has no such
// variable, so it is not Galera.
func isGalera(ctx context.Context, db *sql.DB) bool {
	var on int
	return db.QueryRowContext(ctx, "SELECT @@wsrep_on").Scan(&on) == nil && on == 1
}

// TxOptions are the options every onceflow transaction uses. Its isolation is READ
// COMMITTED, which keeps InnoDB from taking gap locks. So the inbox and outbox never block
// unrelated inserts. Pools opened by Open set that level for the session, and Open checks
// it. So the options leave the level at the session's, and no SET precedes each BEGIN.
// InTx checks a pool opened otherwise with CheckIsolation the first time it sees it.
var TxOptions = &sql.TxOptions{}

// InTx runs fn in a READ COMMITTED transaction and commits it. A failure of fn rolls back.
// A failed rollback is joined to fn's error. A failed commit is returned and never
// swallowed. Its error wraps ErrCommitUnknown when the COMMIT got no answer from the server.
//
// The first time InTx sees a pool, it checks with CheckIsolation that its sessions run at
// READ COMMITTED. That costs one query per pool and process. Until they do, InTx refuses to
// begin, with an error wrapping ErrIsolation. So a pool left at REPEATABLE READ, MariaDB's
// default, never runs an onceflow transaction. Setting the level on each transaction
// instead would cost a SET, a round trip, before every BEGIN.
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
// back, because the connection broke while it ran. The transaction may have committed or
// not, and only a later read tells.
var ErrCommitUnknown = errors.New("the outcome of the commit is unknown")

// commitUnknown reports whether a failed Commit may still have committed. It has not when
// the server answered with an error. Nor has it when database/sql rolled back before sending
// COMMIT, because the context was done or the transaction was already over.
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

// IsLockConflict reports a deadlock or a lock-wait timeout. On PostgreSQL it reports a
// deadlock, a serialization failure or lock_timeout. The server rolled the transaction back,
// and it may simply run again. Galera's certification failure is a deadlock error too, at
// any statement or at COMMIT. It means that the write set conflicts with one that another
// node committed first.
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

// IsAccessDenied reports a statement the server refused for want of a privilege. The
// error is 1142 on MySQL and 42501 on PostgreSQL.
func IsAccessDenied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1142 || pgCode(err) == "42501"
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// CheckIdent validates an identifier that reaches SQL text, such as a table name. Values are
// always bound parameters. Identifiers cannot be, so they are checked instead.
func CheckIdent(kind, s string) error {
	if !identRe.MatchString(s) {
		return fmt.Errorf("invalid %s %q: must match %s", kind, s, identRe)
	}
	return nil
}

// IsConnError reports an error that means the server could not be reached or the
// connection broke. Retrying later may succeed, and the handler is not at fault.
func IsConnError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) {
		return true
	}
	// A Galera node may not be part of the primary component, or not be ready yet. Another
	// node may take the statement on a new connection.
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == ErWsrepNotReady
	}
	// PostgreSQL ended the session, and its transaction rolled back: it idled in the
	// transaction past idle_in_transaction_session_timeout, or it was terminated.
	if pgSessionEnded(pgCode(err)) {
		return true
	}
	// With pgx, the connection broke while a statement such as a COMMIT ran, or pgx closed
	// it after a failed read.
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

// CreateDatabase creates the DSN's database if it does not exist. It needs a privileged DSN.
func CreateDatabase(ctx context.Context, dsn string) error {
	return EnsureDatabase(ctx, Config{DSN: dsn})
}

// EnsureDatabase creates the database of cfg's DSN if it does not exist. It connects with
// cfg's password and TLS. Only privileged users may call it.
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

// Account logs in as cfg says without choosing a database, so it works before any grant
// on one. It returns the account that the server's CURRENT_USER matched, quoted for GRANT
// as `user`@`host`. Examples are `onceflow`@`127.0.0.1` and `onceflow`@`%`.
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

package dbx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// PostgreSQL error codes, or SQLSTATEs, that onceflow reacts to.
const (
	pgUniqueViolation      = "23505"
	pgSerializationFailure = "40001"
	pgDeadlockDetected     = "40P01"
	pgLockNotAvailable     = "55P03"
	pgDuplicateDatabase    = "42P04"
	// pgIdleInTxTimeout ends a session whose transaction idled for longer than
	// idle_in_transaction_session_timeout. The server has closed the connection.
	pgIdleInTxTimeout = "25P03"
)

// pgSessionEnded reports a SQLSTATE with which PostgreSQL ends the session: a connection
// exception (class 08), an idle transaction or session timed out, or the session was
// terminated by an administrator or a shutdown.
func pgSessionEnded(code string) bool {
	switch code {
	case pgIdleInTxTimeout, "57P01", "57P02", "57P05":
		return true
	}
	return strings.HasPrefix(code, "08")
}

// pgIdleTimeoutVar is PostgreSQL's setting that ends a session idle in a transaction.
const pgIdleTimeoutVar = "idle_in_transaction_session_timeout"

// parsePostgresDSN validates a postgres:// DSN. A database name is required, and the
// servers are named in the address part only. The session runs at READ COMMITTED in UTC.
func parsePostgresDSN(dsn string) (*pgx.ConnConfig, error) {
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's message quotes the DSN, with its password masked as best pgx can. pgDetail
		// drops the quote and masks what is left.
		return nil, fmt.Errorf("bad database dsn %q: %s (expected postgres://user:pass@host:port/db)", MaskDSN(dsn), pgDetail(err, dsn))
	}
	u, err := url.Parse(dsn)
	if err != nil || strings.Trim(u.Path, "/") == "" {
		return nil, fmt.Errorf("bad database dsn %q: no database name after the slash", MaskDSN(dsn))
	}
	// pgx lets a host, hostaddr or port parameter replace the URL's servers. One is taken
	// only where the URL names no host, as for a Unix socket (postgres:///db?host=/run/postgresql).
	if u.Host != "" {
		for k := range u.Query() {
			if k == "host" || k == "hostaddr" || k == "port" {
				return nil, fmt.Errorf("bad database dsn %q: parameter %s names a server besides the address part: the servers go in postgres://user@host:port,host:port/db", MaskDSN(dsn), k)
			}
		}
	}
	if pc.RuntimeParams == nil {
		pc.RuntimeParams = map[string]string{}
	}
	if _, ok := pc.RuntimeParams["default_transaction_isolation"]; !ok {
		pc.RuntimeParams["default_transaction_isolation"] = "read committed"
	}
	if _, ok := pc.RuntimeParams["timezone"]; !ok {
		pc.RuntimeParams["timezone"] = "UTC"
	}
	if pc.ConnectTimeout == 0 {
		pc.ConnectTimeout = 5 * time.Second
	}
	return pc, nil
}

// postgresConfig is parsePostgresDSN's config with cfg's Password and TLS applied.
func (cfg Config) postgresConfig() (*pgx.ConnConfig, error) {
	pc, err := parsePostgresDSN(cfg.DSN)
	if err != nil {
		return nil, err
	}
	if cfg.Password != "" {
		pc.Password = cfg.Password
	}
	if cfg.TLS.Enabled() {
		if pc.TLSConfig != nil && !strings.Contains(cfg.DSN, "sslmode=prefer") && !strings.Contains(cfg.DSN, "sslmode=allow") && strings.Contains(cfg.DSN, "sslmode=") {
			return nil, fmt.Errorf("database dsn %q sets sslmode and db.tls.* is set too: use one", MaskDSN(cfg.DSN))
		}
		tc, err := cfg.TLS.Config()
		if err != nil {
			return nil, err
		}
		if tc.ServerName == "" {
			tc.ServerName = pc.Host
		}
		pc.TLSConfig, pc.Fallbacks = tc, nil
	}
	return pc, nil
}

func openPostgres(ctx context.Context, cfg Config) (*sql.DB, error) {
	pc, err := cfg.postgresConfig()
	if err != nil {
		return nil, err
	}
	// A startup parameter of every connection, so it costs no statement.
	if _, ok := pc.RuntimeParams[pgIdleTimeoutVar]; !ok && cfg.IdleTxTimeout > 0 {
		pc.RuntimeParams[pgIdleTimeoutVar] = strconv.FormatInt(int64((cfg.IdleTxTimeout+time.Millisecond-1)/time.Millisecond), 10) // in milliseconds, rounded up
	}
	db := stdlib.OpenDB(*pc)
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxIdleConns)
	db.SetConnMaxLifetime(cfg.ConnMaxLifetime)
	where := fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
	pctx, cancel := context.WithTimeout(ctx, cfg.PingTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("database %s: %w", where, err)
		}
		return nil, fmt.Errorf("database %s unreachable: %w (start it with `scripts/infra.sh up`)", where, err)
	}
	setDialect(db, Postgres)
	if iso, err := SessionIsolation(pctx, db); err != nil || iso != ReadCommitted {
		_ = db.Close()
		return nil, fmt.Errorf("database %s: %w: session isolation is %q (%v): leave default_transaction_isolation out of the dsn", where, ErrIsolation, iso, err)
	}
	return db, nil
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// pgConstraint is the name of the constraint a PostgreSQL error names, or "" for none.
func pgConstraint(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.ConstraintName
	}
	return ""
}

// ensurePostgresDatabase creates the DSN's database unless it exists. It connects to the
// server's "postgres" database to do so.
func ensurePostgresDatabase(ctx context.Context, cfg Config) error {
	pc, err := cfg.postgresConfig()
	if err != nil {
		return err
	}
	name := pc.Database
	if err := CheckIdent("database name", name); err != nil {
		return err
	}
	pc.Database = "postgres"
	db := stdlib.OpenDB(*pc)
	defer db.Close()
	var one int
	err = db.QueryRowContext(ctx, "SELECT 1 FROM pg_database WHERE datname = $1", name).Scan(&one)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		if IsConnError(err) {
			return fmt.Errorf("database %s:%d unreachable: %w (start it with `scripts/infra.sh up`)", pc.Host, pc.Port, err)
		}
		return fmt.Errorf("create database %s: %w", name, err)
	}
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil && pgCode(err) != pgDuplicateDatabase {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// postgresAccount returns the role cfg logs in as, quoted for GRANT.
func postgresAccount(ctx context.Context, cfg Config) (string, error) {
	pc, err := cfg.postgresConfig()
	if err != nil {
		return "", err
	}
	db := stdlib.OpenDB(*pc)
	defer db.Close()
	var cur string
	if err := db.QueryRowContext(ctx, "SELECT current_user").Scan(&cur); err != nil {
		if IsConnError(err) {
			return "", fmt.Errorf("database %s:%d unreachable: %w (start it with `scripts/infra.sh up`)", pc.Host, pc.Port, err)
		}
		return "", fmt.Errorf("log in as %s: %w", pc.User, err)
	}
	return `"` + strings.ReplaceAll(cur, `"`, `""`) + `"`, nil
}

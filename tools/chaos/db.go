package main

import (
	"database/sql"
	"fmt"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// The database the run is on: MariaDB (default) or PostgreSQL (-dialect postgres, DB=postgres
// make chaos). The harness's and the checker's own SQL is written once with '?' and rebound
// for the pool's dialect (dbx.DialectOf); where the dialects differ it branches.

// dsn is the DSN of user ("name:password") on the database db at addr, for dialect: the
// routers get it, the harness and the checker open their own pools on it.
func dsn(dialect dbx.Dialect, user, addr, db string) string {
	if dialect.IsPostgres() {
		return fmt.Sprintf("postgres://%s@%s/%s?connect_timeout=5&sslmode=disable", user, addr, db)
	}
	return fmt.Sprintf("%s@tcp(%s)/%s?timeout=5s&readTimeout=60s&writeTimeout=60s", user, addr, db)
}

// parseDialect is -dialect: mariadb (default) or postgres.
func parseDialect(s string) (dbx.Dialect, error) {
	switch s {
	case "", string(dbx.MariaDB):
		return dbx.MariaDB, nil
	case string(dbx.Postgres):
		return dbx.Postgres, nil
	}
	return "", fmt.Errorf("-dialect %q: use mariadb or postgres", s)
}

// openDB opens a pool of the harness's own on dsn: pgx's database/sql driver for a
// postgres:// DSN, else go-sql-driver through pkg/dbx's connector, the routers' failover
// connector for a DSN listing several servers (the Galera profile); lazily (no ping: the
// callers retry or report).
func openDB(dsn string) (*sql.DB, error) {
	if dbx.IsPostgresDSN(dsn) {
		db, err := sql.Open("pgx", dsn) // registered by pkg/dbx's import of pgx's stdlib
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dbx.MaskDSN(dsn), err)
		}
		return db, nil
	}
	// dbx reads the address part as the driver does, never a tcp(...) in the parameters.
	mc, err := dbx.ParseDriverDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	conn, err := dbx.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dbx.MaskDSN(dsn), err)
	}
	return sql.OpenDB(conn), nil
}

// dsnServers are the servers of a go-sql-driver DSN's tcp(...) part; none when it does not
// parse.
func dsnServers(dsn string) []string {
	mc, err := dbx.ParseDriverDSN(dsn)
	if err != nil {
		return nil
	}
	return dbx.ServerAddrs(mc.Addr)
}

// rebind is q with the placeholders of db's dialect ($1, $2, … on PostgreSQL).
func rebind(db *sql.DB, q string) string { return dbx.DialectOf(db).Rebind(q) }

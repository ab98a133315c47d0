package main

import (
	"database/sql"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

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
// postgres:// DSN, go-sql-driver otherwise; lazily (no ping: the callers retry or report).
func openDB(dsn string) (*sql.DB, error) {
	driver := "mysql"
	if dbx.IsPostgresDSN(dsn) {
		driver = "pgx" // registered by pkg/dbx's import of pgx's stdlib
	}
	if servers := dsnServers(dsn); len(servers) > 1 {
		// Several servers (the Galera profile): pkg/dbx's failover connector, the routers'.
		mc, err := mysql.ParseDSN(strings.Replace(dsn, strings.Join(servers, ","), servers[0], 1))
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dbx.MaskDSN(dsn), err)
		}
		mc.Addr = strings.Join(servers, ",")
		conn, err := dbx.NewConnector(mc)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dbx.MaskDSN(dsn), err)
		}
		return sql.OpenDB(conn), nil
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dbx.MaskDSN(dsn), err)
	}
	return db, nil
}

// dsnServers are the servers of a go-sql-driver DSN's tcp(...) part.
func dsnServers(dsn string) []string {
	i := strings.LastIndex(dsn, "@tcp(")
	if i < 0 {
		return nil
	}
	j := strings.IndexByte(dsn[i:], ')')
	if j < 0 {
		return nil
	}
	return dbx.ServerAddrs(dsn[i+5 : i+j])
}

// rebind is q with the placeholders of db's dialect ($1, $2, … on PostgreSQL).
func rebind(db *sql.DB, q string) string { return dbx.DialectOf(db).Rebind(q) }

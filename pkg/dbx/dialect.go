package dbx

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/jackc/pgx/v5/stdlib"
)

// Dialect is the SQL a database server speaks where onceflow's statements differ. They
// differ in placeholders, upserts, INSERT … RETURNING and error classes. Statements are
// written with '?' placeholders, and with MySQL's syntax where it is common to all. Code
// that differs asks DialectOf for the pool's dialect. Rebind gives PostgreSQL its $n
// placeholders.
type Dialect string

const (
	// MariaDB is MariaDB 10.6 or later, with INSERT … RETURNING and SKIP LOCKED.
	MariaDB Dialect = "mariadb"
	// MySQL8 is MySQL 8.0, without RETURNING or anything else MariaDB-only. db.dialect=mysql8
	// runs this SQL on a MariaDB server too. So the test suite checks it without a MySQL 8
	// server.
	MySQL8 Dialect = "mysql8"
	// Postgres is PostgreSQL 15 or later, through pgx's database/sql driver.
	Postgres Dialect = "postgres"
)

// Dialects lists the dialects, as db.dialect takes them.
var Dialects = []Dialect{MariaDB, MySQL8, Postgres}

// ParseDialect reads a db.dialect value. An empty value gives "", and the DSN and the server
// then choose.
func ParseDialect(s string) (Dialect, error) {
	switch d := Dialect(strings.ToLower(strings.TrimSpace(s))); d {
	case "", MariaDB, MySQL8, Postgres:
		return d, nil
	}
	return "", fmt.Errorf("db.dialect %q: want one of mariadb, mysql8, postgres (or empty: from the DSN and the server's version)", s)
}

// MySQLFamily reports MariaDB or MySQL 8. Both use go-sql-driver/mysql, backquoted
// identifiers, ON DUPLICATE KEY UPDATE and LAST_INSERT_ID.
func (d Dialect) MySQLFamily() bool { return d != Postgres }

// IsPostgres reports PostgreSQL.
func (d Dialect) IsPostgres() bool { return d == Postgres }

// Returning reports INSERT … RETURNING, which MariaDB and PostgreSQL have and MySQL 8 lacks.
func (d Dialect) Returning() bool { return d != MySQL8 }

// Rebind rewrites q's '?' placeholders as $1, $2, … for PostgreSQL and returns it unchanged
// for the MySQL family. A '?' inside a quoted string, a quoted identifier or a comment is
// left alone.
func (d Dialect) Rebind(q string) string {
	if d != Postgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'' || c == '"' || c == '`':
			j := strings.IndexByte(q[i+1:], c)
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+2])
			i += j + 1
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+1])
			i += j
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Quote quotes an identifier for d. CheckIdent must have checked it already.
func (d Dialect) Quote(ident string) string {
	if d == Postgres {
		return `"` + ident + `"`
	}
	return "`" + ident + "`"
}

// dialects remembers the dialect of each pool Open opened. It holds the pools weakly, as
// checkedPools does.
var dialects sync.Map // weak.Pointer[sql.DB] → Dialect

// setDialect records d as db's dialect. It replaces one that DialectOf guessed before,
// because Open's isolation check asks DialectOf before Open records db.dialect.
func setDialect(db *sql.DB, d Dialect) {
	k := weak.Make(db)
	if _, loaded := dialects.Swap(k, d); !loaded {
		runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { dialects.Delete(k) }, k)
	}
}

// DialectOf returns the dialect of a pool. For a pool that Open opened, it is the one Open
// chose from db.dialect, or else from the DSN and the server's version. For a pool opened
// otherwise, it is PostgreSQL when the driver is pgx's. Otherwise the server's VERSION
// tells the MySQL family apart, read once per pool.
func DialectOf(db *sql.DB) Dialect {
	if v, ok := dialects.Load(weak.Make(db)); ok {
		return v.(Dialect)
	}
	if _, ok := db.Driver().(*stdlib.Driver); ok {
		setDialect(db, Postgres)
		return Postgres
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := serverDialect(ctx, db)
	if err != nil {
		return MariaDB // not remembered, so asked again next time
	}
	setDialect(db, d)
	return d
}

// serverDialect tells MariaDB from MySQL by the server's version string.
func serverDialect(ctx context.Context, db Querier) (Dialect, error) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return "", fmt.Errorf("read server version: %w", err)
	}
	if strings.Contains(strings.ToLower(v), "mariadb") {
		return MariaDB, nil
	}
	return MySQL8, nil
}

// IsPostgresDSN reports a PostgreSQL URL DSN, which starts with postgres:// or postgresql://.
func IsPostgresDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// DSNInfo is what a DSN names, whatever its database.
type DSNInfo struct {
	Postgres bool   // a postgres:// DSN
	User     string // the user it logs in as
	Addr     string // host:port
	DBName   string // the database
}

// ParseDSNInfo validates dsn and returns what it names. It applies ParseDSN's rules for the
// MySQL family and pgx's for PostgreSQL.
func ParseDSNInfo(dsn string) (DSNInfo, error) {
	if IsPostgresDSN(dsn) {
		pc, err := parsePostgresDSN(dsn)
		if err != nil {
			return DSNInfo{}, err
		}
		return DSNInfo{Postgres: true, User: pc.User, Addr: fmt.Sprintf("%s:%d", pc.Host, pc.Port), DBName: pc.Database}, nil
	}
	mc, err := ParseDSN(dsn)
	if err != nil {
		return DSNInfo{}, err
	}
	return DSNInfo{User: mc.User, Addr: mc.Addr, DBName: mc.DBName}, nil
}

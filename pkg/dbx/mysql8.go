package dbx

import (
	"context"
	"database/sql/driver"
	"fmt"
	"regexp"

	"github.com/go-sql-driver/mysql"
)

// mariaDBOnly matches SQL that MariaDB runs and MySQL 8.0 refuses. Such SQL is INSERT or
// DELETE … RETURNING, the MariaDB name of the NO PAD binary collation, MariaDB's ALTER TABLE
// algorithm NOCOPY, and sequences. The session variable that MariaDB names tx_isolation is
// transaction_isolation on MySQL 8. SessionIsolation reads it through both names.
var mariaDBOnly = regexp.MustCompile(`(?i)\bRETURNING\b|\butf8mb4_nopad_bin\b|\bNOCOPY\b|\b(CREATE|DROP) SEQUENCE\b|\bNEXTVAL\s*\(`)

// errMySQL8Refused is what a mysql8 pool answers for a statement MySQL 8 would refuse. It
// is a syntax error, as MySQL 8 gives.
func errMySQL8Refused(query string) error {
	return &mysql.MySQLError{Number: 1064, Message: fmt.Sprintf("MariaDB-only SQL (%q) refused under db.dialect=mysql8: MySQL 8.0 would refuse it", mariaDBOnly.FindString(query))}
}

// mysql8Connector opens go-sql-driver connections that refuse MariaDB-only SQL before it
// reaches the server. With db.dialect=mysql8 on a MariaDB server, everything onceflow runs
// is SQL that MySQL 8.0 also accepts, or an error.
type mysql8Connector struct{ driver.Connector }

func (c mysql8Connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	full, ok := conn.(mysqlConn)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("db.dialect=mysql8: the driver's connection %T lacks an interface", conn)
	}
	return mysql8Conn{full}, nil
}

// mysqlConn is what go-sql-driver/mysql's connection implements.
type mysqlConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.NamedValueChecker
	driver.SessionResetter
	driver.Validator
}

type mysql8Conn struct{ mysqlConn }

func (c mysql8Conn) check(q string) error {
	if mariaDBOnly.MatchString(q) {
		return errMySQL8Refused(q)
	}
	return nil
}

func (c mysql8Conn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c mysql8Conn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	if err := c.check(q); err != nil {
		return nil, err
	}
	return c.mysqlConn.PrepareContext(ctx, q)
}

func (c mysql8Conn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.check(q); err != nil {
		return nil, err
	}
	return c.mysqlConn.ExecContext(ctx, q, args)
}

func (c mysql8Conn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.check(q); err != nil {
		return nil, err
	}
	return c.mysqlConn.QueryContext(ctx, q, args)
}

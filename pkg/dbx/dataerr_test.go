package dbx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// dataErrSchema is the table the data errors are provoked on, per dialect. It has a column
// of each kind a value can be refused by, and a unique key, a foreign key and a CHECK.
var dataErrSchema = map[bool][]string{
	false: {
		`CREATE TABLE parent (id INT PRIMARY KEY) ENGINE = InnoDB`,
		`CREATE TABLE data_t (
			id        INT PRIMARY KEY,
			name      VARCHAR(5),
			txt       TEXT CHARACTER SET utf8mb4,
			n         SMALLINT,
			at        DATETIME,
			parent_id INT NULL,
			kind      ENUM('a', 'b') NULL,
			qty       INT,
			code      VARCHAR(10),
			req       VARCHAR(10) NOT NULL DEFAULT '',
			UNIQUE KEY uk_code (code),
			CONSTRAINT qty_positive CHECK (qty >= 0),
			CONSTRAINT fk_parent FOREIGN KEY (parent_id) REFERENCES parent (id)
		) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`,
	},
	true: {
		`CREATE TABLE parent (id INT PRIMARY KEY)`,
		`CREATE TABLE data_t (
			id        INT PRIMARY KEY,
			name      VARCHAR(5),
			txt       TEXT,
			n         SMALLINT,
			at        TIMESTAMP,
			parent_id INT NULL CONSTRAINT fk_parent REFERENCES parent (id),
			qty       INT CONSTRAINT qty_positive CHECK (qty >= 0),
			code      VARCHAR(10) CONSTRAINT uk_code UNIQUE,
			req       VARCHAR(10) NOT NULL DEFAULT ''
		)`,
	},
}

// TestIsDataErrorOnTheServer provokes each kind of refused value on the tests' database,
// MariaDB or PostgreSQL as OFTEST_DB says. It checks that IsDataError reports each, wrapped
// or not, with the server's own code. It checks that errors of the statement or the schema
// are not data errors.
func TestIsDataErrorOnTheServer(t *testing.T) {
	d := testenv.DB(t, 2)
	pg := testenv.Dialect().IsPostgres()
	for _, q := range dataErrSchema[pg] {
		d.AdminExec(t, q)
	}
	d.AdminExec(t, `INSERT INTO parent (id) VALUES (1)`)
	d.AdminExec(t, `INSERT INTO data_t (id, parent_id, code, qty) VALUES (100, 1, 'taken', 2147483647)`)

	type stmt struct {
		q    string
		args []any
		code string // the server's: an error number on MySQL, a SQLSTATE on PostgreSQL
	}
	for _, tc := range []struct {
		name      string
		mysql, pg stmt // an empty q: not on that dialect
		data      bool
		key       string // DuplicateKey's answer
	}{
		{name: "invalid byte sequence",
			mysql: stmt{`INSERT INTO data_t (id, txt) VALUES (1, ?)`, []any{"a\xff\xfeb"}, "1366"},
			pg:    stmt{`INSERT INTO data_t (id, txt) VALUES (1, ?)`, []any{"a\xff\xfeb"}, "22021"}, data: true},
		{name: "NUL in text",
			pg:   stmt{`INSERT INTO data_t (id, txt) VALUES (2, ?)`, []any{"a\x00b"}, "22021"},
			data: true},
		{name: "string too long",
			mysql: stmt{`INSERT INTO data_t (id, name) VALUES (3, ?)`, []any{"abcdefgh"}, "1406"},
			pg:    stmt{`INSERT INTO data_t (id, name) VALUES (3, ?)`, []any{"abcdefgh"}, "22001"}, data: true},
		{name: "number out of range",
			mysql: stmt{`INSERT INTO data_t (id, n) VALUES (4, 40000)`, nil, "1264"},
			pg:    stmt{`INSERT INTO data_t (id, n) VALUES (4, 40000)`, nil, "22003"}, data: true},
		{name: "arithmetic out of range",
			mysql: stmt{`UPDATE data_t SET qty = CAST(0 AS UNSIGNED) - 1 WHERE id = 100`, nil, "1690"},
			pg:    stmt{`UPDATE data_t SET qty = qty + 1 WHERE id = 100`, nil, "22003"}, data: true},
		{name: "bad datetime",
			mysql: stmt{`INSERT INTO data_t (id, at) VALUES (5, '2026-13-45 00:00:00')`, nil, "1292"},
			pg:    stmt{`INSERT INTO data_t (id, at) VALUES (5, '2026-13-45 00:00:00')`, nil, "22008"}, data: true},
		{name: "not a number",
			mysql: stmt{`INSERT INTO data_t (id, n) VALUES (6, 'abc')`, nil, "1366"},
			pg:    stmt{`INSERT INTO data_t (id, n) VALUES (6, 'abc')`, nil, "22P02"}, data: true},
		{name: "division by zero",
			mysql: stmt{`INSERT INTO data_t (id, n) VALUES (7, 1/0)`, nil, "1365"},
			pg:    stmt{`INSERT INTO data_t (id, n) VALUES (7, 1/0)`, nil, "22012"}, data: true},
		{name: "not an enum value",
			mysql: stmt{`INSERT INTO data_t (id, kind) VALUES (8, 'z')`, nil, "1265"}, data: true},
		{name: "null in a not-null column",
			mysql: stmt{`INSERT INTO data_t (id, req) VALUES (9, NULL)`, nil, "1048"},
			pg:    stmt{`INSERT INTO data_t (id, req) VALUES (9, NULL)`, nil, "23502"}, data: true},
		{name: "foreign key: no parent",
			mysql: stmt{`INSERT INTO data_t (id, parent_id) VALUES (10, 999)`, nil, "1452"},
			pg:    stmt{`INSERT INTO data_t (id, parent_id) VALUES (10, 999)`, nil, "23503"}, data: true},
		{name: "foreign key: referenced",
			mysql: stmt{`DELETE FROM parent WHERE id = 1`, nil, "1451"},
			pg:    stmt{`DELETE FROM parent WHERE id = 1`, nil, "23503"}, data: true},
		{name: "check constraint",
			mysql: stmt{`INSERT INTO data_t (id, qty) VALUES (11, -1)`, nil, "4025"},
			pg:    stmt{`INSERT INTO data_t (id, qty) VALUES (11, -1)`, nil, "23514"}, data: true},
		{name: "unique key",
			mysql: stmt{`INSERT INTO data_t (id, code) VALUES (12, 'taken')`, nil, "1062"},
			pg:    stmt{`INSERT INTO data_t (id, code) VALUES (12, 'taken')`, nil, "23505"}, data: true, key: "uk_code"},
		{name: "syntax error",
			mysql: stmt{`INSERT INTO data_t VALUES (`, nil, "1064"},
			pg:    stmt{`INSERT INTO data_t VALUES (`, nil, "42601"}},
		{name: "unknown table",
			mysql: stmt{`INSERT INTO no_such_table (id) VALUES (1)`, nil, "1146"},
			pg:    stmt{`INSERT INTO no_such_table (id) VALUES (1)`, nil, "42P01"}},
		{name: "unknown column",
			mysql: stmt{`INSERT INTO data_t (id, no_such_column) VALUES (13, 1)`, nil, "1054"},
			pg:    stmt{`INSERT INTO data_t (id, no_such_column) VALUES (13, 1)`, nil, "42703"}},
	} {
		s := map[bool]stmt{false: tc.mysql, true: tc.pg}[pg]
		if s.q == "" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			err := execRefused(t, d.DB, testenv.Rebind(s.q), s.args...)
			if err == nil {
				t.Fatalf("%s: no error, want the server's %s", s.q, s.code)
			}
			if got := serverCode(err); got != s.code {
				t.Fatalf("%s: %v (code %q), want the server's %s", s.q, err, got, s.code)
			}
			for _, e := range []error{err, fmt.Errorf("insert points: %w", err)} {
				if got := dbx.IsDataError(e); got != tc.data {
					t.Errorf("IsDataError(%v) = %v, want %v", e, got, tc.data)
				}
				if got := dbx.DuplicateKey(e); got != tc.key {
					t.Errorf("DuplicateKey(%v) = %q, want %q", e, got, tc.key)
				}
			}
			if dbx.IsLockConflict(err) || dbx.IsConnError(err) {
				t.Errorf("%v is a lock conflict or a connection error too", err)
			}
		})
	}
}

// execRefused runs q in a transaction of its own, because a failed statement aborts a PostgreSQL
// transaction. It returns q's error and rolls the transaction back.
func execRefused(t *testing.T, db *sql.DB, q string, args ...any) error {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	_, err = tx.Exec(q, args...)
	return err
}

// serverCode is the code the server answered err with, or "" for none.
func serverCode(err error) string {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return fmt.Sprint(me.Number)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// Some errors are about neither server's data, such as a lock conflict, a lost connection
// or no error. The test also checks the key names DuplicateKey reads out of each server's
// wording.
func TestIsDataErrorOthers(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		data bool
		key  string
	}{
		{"nil", nil, false, ""},
		{"eof", io.EOF, false, ""},
		{"deadlock", &mysql.MySQLError{Number: dbx.ErLockDeadlock}, false, ""},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, false, ""},
		{"access denied", &mysql.MySQLError{Number: 1142}, false, ""},
		{"data too long", &mysql.MySQLError{Number: 1406, Message: "Data too long for column 'user_id' at row 1"}, true, ""},
		{"MariaDB's duplicate", &mysql.MySQLError{Number: dbx.ErDupEntry, Message: "Duplicate entry 'o-1-coupon' for key 'uk_dedup'"}, true, "uk_dedup"},
		{"MySQL 8's duplicate", &mysql.MySQLError{Number: dbx.ErDupEntry, Message: "Duplicate entry 'o-1-coupon' for key 'inbox.uk_dedup'"}, true, "uk_dedup"},
		{"a value that looks like the wording", &mysql.MySQLError{Number: dbx.ErDupEntry, Message: "Duplicate entry 'x' for key 'uk_dedup'' for key 'uk_order'"}, true, "uk_order"},
		{"PostgreSQL's duplicate", &pgconn.PgError{Code: "23505", ConstraintName: "uk_dedup", TableName: "inbox"}, true, "uk_dedup"},
		{"PostgreSQL's exclusion", &pgconn.PgError{Code: "23P01"}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dbx.IsDataError(tc.err); got != tc.data {
				t.Errorf("IsDataError = %v, want %v", got, tc.data)
			}
			if got := dbx.DuplicateKey(tc.err); got != tc.key {
				t.Errorf("DuplicateKey = %q, want %q", got, tc.key)
			}
		})
	}
}

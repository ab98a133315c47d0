package dbx_test

import (
	"context"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Under db.dialect=mysql8 a MariaDB server runs only what MySQL 8.0 accepts: MariaDB-only
// SQL is refused before it reaches the server, and the session isolation is read through
// MySQL 8's variable. The same statement through a mariadb pool runs.
func TestMySQL8RefusesMariaDBOnlySQL(t *testing.T) {
	d := testenv.DB(t, 2)
	d.AdminExec(t, "CREATE TABLE t (id INT PRIMARY KEY)")
	ctx := context.Background()
	for _, dialect := range []dbx.Dialect{dbx.MariaDB, dbx.MySQL8} {
		db, err := dbx.Open(ctx, dbx.Config{DSN: d.DSN, Dialect: string(dialect), MaxOpenConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if got := dbx.DialectOf(db); got != dialect {
			t.Errorf("DialectOf = %s, want %s", got, dialect)
		}
		if iso, err := dbx.SessionIsolation(ctx, db); err != nil || iso != dbx.ReadCommitted {
			t.Errorf("%s: isolation %q, %v", dialect, iso, err)
		}
		var id int
		err = db.QueryRowContext(ctx, "INSERT INTO t VALUES (?) RETURNING id", len(dialect)).Scan(&id)
		if refused := err != nil; refused != (dialect == dbx.MySQL8) {
			t.Errorf("%s: INSERT … RETURNING: %v", dialect, err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (?) ON DUPLICATE KEY UPDATE id = id", 100+len(dialect)); err != nil {
			t.Errorf("%s: SQL both servers run: %v", dialect, err)
		}
	}
}

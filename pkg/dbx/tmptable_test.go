package dbx_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// An error naming a server's internal temporary table is one, whatever its number; an error
// of a table of the schema, a client's error or PostgreSQL's are not.
func TestIsTempTableError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		// What MariaDB 10.11 returned to `router verify` when /tmp lost the table's file.
		{&mysql.MySQLError{Number: 6, Message: `Error on delete of '/tmp/#sql-temptable-1377-5b15-4d.MAI' (Errcode: 2 "No such file or directory")`}, true},
		{fmt.Errorf("verify: %w", &mysql.MySQLError{Number: 1114, Message: "The table '/tmp/#sql-temptable-1377-5b15-4e' is full"}), true},
		{&mysql.MySQLError{Number: 1034, Message: "Index for table '/tmp/#sql_1377_0' is corrupt; try to repair it"}, true},
		{&mysql.MySQLError{Number: 1146, Message: "Table 'onceflow.outbox' doesn't exist"}, false},
		{&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded; try restarting transaction"}, false},
		{&pgconn.PgError{Code: "53100", Message: "could not write to file \"base/pgsql_tmp/pgsql_tmp123.0\""}, false},
		{errors.New("#sql in a plain error"), false},
		{nil, false},
	} {
		if got := dbx.IsTempTableError(tc.err); got != tc.want {
			t.Errorf("IsTempTableError(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

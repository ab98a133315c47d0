package dbx

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// IsTempTableError reports a MySQL-family error about one of the server's internal
// temporary tables, whose files the server names #sql… in its tmpdir. A query that groups
// or sorts more than tmp_table_size writes one to disk. The error means that its file went
// missing or could not be written while the statement ran: something removed files from
// the tmpdir, or the tmpdir ran full. The statement failed as a whole, so a read-only one
// may simply run again.
func IsTempTableError(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number < 2000 && strings.Contains(me.Message, "#sql")
}

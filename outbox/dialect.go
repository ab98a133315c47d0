package outbox

import (
	"strconv"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// sqlText writes the outbox's statements for a pool's dialect. Each statement is written
// once, with '?' placeholders and the SQL that MariaDB, MySQL 8 and PostgreSQL share, such
// as CURRENT_TIMESTAMP(6), CASE WHEN, INTERVAL 'n' SECOND, FOR UPDATE SKIP LOCKED and LIMIT.
// Rebind gives PostgreSQL its $n placeholders. The methods of sqlText hold what differs.
type sqlText struct{ dbx.Dialect }

// now is the database clock at the start of the statement, as MySQL's NOW(6) in the pools'
// UTC. On PostgreSQL it is statement_timestamp() as a UTC TIMESTAMP, like the columns it is
// compared with, whatever the session's time zone. CURRENT_TIMESTAMP is the transaction's
// start, so a relay's claim transaction would mark rows published before it read them.
func (d sqlText) now() string {
	if d.IsPostgres() {
		return "(statement_timestamp() AT TIME ZONE 'UTC')"
	}
	return "NOW(6)"
}

// pendingOrder orders the unpublished rows by id. On PostgreSQL it is ORDER BY
// published_at, id, the order of idx_unpublished. Given ORDER BY id under published_at IS
// NULL, the PostgreSQL planner does not see that order. It would walk the primary key
// through every published row kept for the retention instead.
func (d sqlText) pendingOrder() string {
	if d.IsPostgres() {
		return "ORDER BY published_at, id"
	}
	return "ORDER BY id"
}

// micros is an interval of '?' microseconds. Its argument is an int64.
func (d sqlText) micros() string {
	if d.IsPostgres() {
		return "(? * INTERVAL '1 microsecond')"
	}
	return "INTERVAL ? MICROSECOND"
}

// idIn returns the condition that column matches one of ids, and its arguments. On the
// MySQL family it is an IN list. On PostgreSQL it is "= ANY(?)" with one int8[] argument,
// and its text is the same for any number of ids. pgx prepares each new statement text, so
// an IN list would cost one more round trip and one more cached statement per batch size.
func (d sqlText) idIn(column string, ids []int64) (string, []any) {
	if d.IsPostgres() {
		return column + " = ANY(?)", []any{ids}
	}
	b := make([]byte, 0, len(column)+5+2*len(ids))
	b = append(b, column...)
	b = append(b, " IN ("...)
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '?')
		args[i] = id
	}
	b = append(b, ')')
	return string(b), args
}

// strIn is idIn for strings. On PostgreSQL its one argument is a text[].
func (d sqlText) strIn(column string, vals []string) (string, []any) {
	if d.IsPostgres() {
		return column + " = ANY(?)", []any{vals}
	}
	b := make([]byte, 0, len(column)+5+2*len(vals))
	b = append(b, column...)
	b = append(b, " IN ("...)
	args := make([]any, len(vals))
	for i, v := range vals {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '?')
		args[i] = v
	}
	b = append(b, ')')
	return string(b), args
}

// deleteLimit is a DELETE of at most limit rows of table matching where. The MySQL family
// has DELETE … LIMIT. PostgreSQL has none, so it deletes the ids of a limited SELECT.
func (d sqlText) deleteLimit(table, where string, limit int) string {
	if d.IsPostgres() {
		return "DELETE FROM " + table + " WHERE id IN (SELECT id FROM " + table + " WHERE " + where + " LIMIT " + strconv.Itoa(limit) + ")"
	}
	return "DELETE FROM " + table + " WHERE " + where + " LIMIT " + strconv.Itoa(limit)
}

// currentDatabase is the statement that reads the session's database. It reads NULL when
// the session has none.
func (d sqlText) currentDatabase() string {
	if d.IsPostgres() {
		return "SELECT current_database()"
	}
	return "SELECT DATABASE()"
}

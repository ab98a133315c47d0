package outbox

import (
	"strconv"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// sqlText writes the outbox's statements for a pool's dialect. They are written once, with
// '?' placeholders and what MariaDB, MySQL 8 and PostgreSQL share (CURRENT_TIMESTAMP(6),
// CASE WHEN, INTERVAL 'n' SECOND, FOR UPDATE SKIP LOCKED, LIMIT); Rebind gives PostgreSQL
// its $n placeholders. What differs is here.
type sqlText struct{ dbx.Dialect }

// now is the database clock at the start of the statement, as MySQL's NOW(6) in the pools'
// UTC: on PostgreSQL statement_timestamp() (not CURRENT_TIMESTAMP, the transaction's start:
// a relay's claim transaction would mark rows published before it read them), as a UTC
// TIMESTAMP like the columns it is compared with, whatever the session's time zone.
func (d sqlText) now() string {
	if d.IsPostgres() {
		return "(statement_timestamp() AT TIME ZONE 'UTC')"
	}
	return "NOW(6)"
}

// pendingOrder orders the unpublished rows (published_at IS NULL) by id: on PostgreSQL as
// ORDER BY published_at, id, the order of idx_unpublished, which its planner does not see
// in ORDER BY id under published_at IS NULL: it would walk the primary key through every
// published row kept for the retention instead.
func (d sqlText) pendingOrder() string {
	if d.IsPostgres() {
		return "ORDER BY published_at, id"
	}
	return "ORDER BY id"
}

// micros is an interval of '?' microseconds (an int64 argument).
func (d sqlText) micros() string {
	if d.IsPostgres() {
		return "(? * INTERVAL '1 microsecond')"
	}
	return "INTERVAL ? MICROSECOND"
}

// idIn returns the condition column matches one of ids, and its arguments: an IN list on
// the MySQL family, "= ANY(?)" with one int8[] argument on PostgreSQL, whose text is the
// same for any number of ids (pgx prepares each new statement text: an IN list of every
// batch size would be one more round trip per size, and as many cached statements).
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

// strIn is idIn for strings (PostgreSQL: one text[] argument).
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

// deleteLimit is a DELETE of at most limit rows of table matching where: MySQL's DELETE …
// LIMIT; on PostgreSQL, which has none, the ids of a limited SELECT.
func (d sqlText) deleteLimit(table, where string, limit int) string {
	if d.IsPostgres() {
		return "DELETE FROM " + table + " WHERE id IN (SELECT id FROM " + table + " WHERE " + where + " LIMIT " + strconv.Itoa(limit) + ")"
	}
	return "DELETE FROM " + table + " WHERE " + where + " LIMIT " + strconv.Itoa(limit)
}

// currentDatabase is the statement that reads the session's database (NULL: none).
func (d sqlText) currentDatabase() string {
	if d.IsPostgres() {
		return "SELECT current_database()"
	}
	return "SELECT DATABASE()"
}

package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/onceflow/onceflow/internal/txdefer"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Inserter inserts rows into one table of a plugin from a plain Handler, the way
// outbox.Writer.Add adds events: at once when the handler runs one delivery per
// transaction, and, in a batch of the group commit (a plain handler run by a Batcher), at
// the end of the batch together with the rows the batch's other deliveries inserted, in
// multi-row INSERTs. A one-step handler whose writes are an Inserter's row and an outbox
// event then costs its batch no round trip of its own (docs/BENCHMARKS.md, "Deferred
// inserts of a plain handler").
//
// What that asks of the handler: the row is not in the table until the batch ends, so a
// Handle must not read it back, nor read rows another delivery may have inserted through
// an Inserter in the same batch (use tx.ExecContext for rows that are read in the same
// transaction); and Insert has no result (no LastInsertId, no rows affected). An error of
// the deferred INSERT (a duplicate key, say) fails the batch, whose deliveries then run
// again one transaction each, where Insert writes at once and returns that error to the
// delivery it belongs to. A delivery rolled back to its savepoint takes its rows with it.
type Inserter struct {
	table   string
	columns []string
	update  string        // the assignments of OnDuplicateKeyUpdate, if any
	db      *sql.DB       // the pool of UseStatements, if any
	insert  string        // one row, run at once
	multi   *dbx.MultiRow // the batch's rows; prepared on db, if set
}

// inserterRows is the most rows one statement of a deferred insert carries.
const inserterRows = 512

// NewInserter returns an Inserter of rows of table with these columns, in the order
// Insert's values come in. Table and column names are checked: letters, digits and
// underscores, as dbx.CheckIdent wants.
func NewInserter(table string, columns ...string) (*Inserter, error) {
	if err := dbx.CheckIdent("inserter table", table); err != nil {
		return nil, err
	}
	if len(columns) == 0 {
		return nil, fmt.Errorf("inserter of %s: no columns", table)
	}
	for i, c := range columns {
		if err := dbx.CheckIdent("column of inserter "+table, c); err != nil {
			return nil, err
		}
		if slices.Contains(columns[:i], c) {
			return nil, fmt.Errorf("inserter of %s: column %q given twice", table, c)
		}
	}
	ins := &Inserter{table: table, columns: slices.Clone(columns)}
	ins.build()
	return ins, nil
}

// OnDuplicateKeyUpdate makes the rows upserts: INSERT … ON DUPLICATE KEY UPDATE
// assignments, for example "points = points + VALUES(points)" to add to a balance. Rows
// of one key in one batch are applied in the order they were inserted, as separate
// statements would be. Call it before first use; it panics on an empty clause or one with
// a semicolon (it is the plugin's own SQL text, never input).
func (ins *Inserter) OnDuplicateKeyUpdate(assignments string) *Inserter {
	if strings.TrimSpace(assignments) == "" || strings.Contains(assignments, ";") {
		panic(fmt.Sprintf("inbox: inserter of %s: ON DUPLICATE KEY UPDATE %q: want assignments without a semicolon", ins.table, assignments))
	}
	ins.update = assignments
	ins.build()
	return ins
}

// text is the INSERT of n rows.
func (ins *Inserter) text(n int) string {
	group := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(ins.columns)), ", ") + ")"
	q := fmt.Sprintf("INSERT INTO %s (%s) VALUES %s", ins.table, strings.Join(ins.columns, ", "),
		strings.TrimSuffix(strings.Repeat(group+", ", n), ", "))
	if ins.update != "" {
		q += " ON DUPLICATE KEY UPDATE " + ins.update
	}
	return q
}

// build makes the statements from the settings.
func (ins *Inserter) build() {
	ins.insert = ins.text(1)
	ins.multi = dbx.NewMultiRow(ins.db, len(ins.columns), inserterRows, ins.text)
}

// UseStatements makes the deferred inserts run as prepared statements of pool db
// (dbx.MultiRow, prepared in the background at their first use), as
// outbox.Writer.UseStatements does: transactions given to Insert must then be db's. Call it
// before first use.
func (ins *Inserter) UseStatements(db *sql.DB) *Inserter {
	ins.db = db
	ins.build()
	return ins
}

// Close closes the prepared statements of UseStatements.
func (ins *Inserter) Close() error { return ins.multi.Close() }

// Insert inserts one row, its values in the order of the Inserter's columns, in tx: at
// once, or at the end of the group-committed batch ctx belongs to (see Inserter).
func (ins *Inserter) Insert(ctx context.Context, tx *sql.Tx, values ...any) error {
	if len(values) != len(ins.columns) {
		return Permanent(fmt.Errorf("insert into %s: %d values for %d columns (%s)", ins.table, len(values), len(ins.columns), strings.Join(ins.columns, ", ")))
	}
	if s := txdefer.From(ctx, tx); s != nil {
		s.Add(deferredInserts{ins}, slices.Clone(values))
		return nil
	}
	if _, err := tx.ExecContext(ctx, ins.insert, values...); err != nil {
		return fmt.Errorf("insert into %s: %w", ins.table, err)
	}
	return nil
}

// deferredInserts writes the rows an Inserter deferred into a txdefer.Set.
type deferredInserts struct{ ins *Inserter }

// DeferredTarget implements txdefer.Targeted.
func (d deferredInserts) DeferredTarget() txdefer.Target {
	return txdefer.Target{Table: d.ins.table, Columns: slices.Clone(d.ins.columns)}
}

// FlushDeferred implements txdefer.Flusher.
func (d deferredInserts) FlushDeferred(ctx context.Context, tx *sql.Tx, rows [][]any) error {
	ins := d.ins
	args := make([]any, 0, len(rows)*len(ins.columns))
	for _, r := range rows {
		args = append(args, r...)
	}
	if _, err := ins.multi.Exec(ctx, tx, args); err != nil {
		return fmt.Errorf("insert %d rows into %s: %w", len(rows), ins.table, err)
	}
	return nil
}

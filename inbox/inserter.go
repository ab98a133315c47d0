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
// outbox.Writer.Add adds events. When the handler runs one delivery per transaction, the
// row is inserted at once. A plain handler may run in a batch of the group commit. There
// the row is inserted at the end of the batch, in multi-row INSERTs, with the rows the
// batch's other deliveries inserted. A one-step handler whose writes are an Inserter's row
// and an outbox event then costs its batch no round trip of its own. See
// docs/BENCHMARKS.md, section "Deferred inserts of a plain handler".
//
// That asks three things of the handler. First, the row is not in the table until the
// batch ends. So a Handle must not read it back. Nor may it read rows that another
// delivery may have inserted through an Inserter in the same batch. Use tx.ExecContext for
// rows that are read in the same transaction. Second, Insert has no result, neither a
// LastInsertId nor a count of rows affected. Third, an error of the deferred INSERT, such
// as a duplicate key, fails the batch. The batch's deliveries then run again in one
// transaction each. There Insert writes at once and returns the error to the delivery it
// belongs to. A delivery rolled back to its savepoint takes its rows with it.
//
// The Inserter writes PostgreSQL's SQL for a pool given to UseStatements that is
// PostgreSQL, or for a transaction of an inbox on PostgreSQL. Its statements then get $n
// placeholders, and an upsert needs OnConflictUpdate.
type Inserter struct {
	table    string
	columns  []string
	update   string // the assignments of OnDuplicateKeyUpdate, if any
	conflict string // PostgreSQL's "(target) DO UPDATE SET assignments" of OnConflictUpdate, if any
	target   []int  // the positions in columns of the conflict target's columns
	db       *sql.DB
	dialect  dbx.Dialect // db's, or "" without UseStatements for the inbox's from dialectFrom
	// insert writes one row at once, and multi the batch's rows, prepared on db if it is
	// set. Each holds a statement per dialect family. Index 0 is the MySQL family's, and
	// index 1 is PostgreSQL's.
	insert [2]string
	multi  [2]*dbx.MultiRow
}

// inserterRows is the most rows one statement of a deferred insert carries.
const inserterRows = 512

// NewInserter returns an Inserter of rows of table with these columns, in the order
// Insert's values come in. It checks the table and column names with dbx.CheckIdent, which
// wants letters, digits and underscores.
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

// OnDuplicateKeyUpdate makes the rows upserts, as INSERT … ON DUPLICATE KEY UPDATE
// assignments. For example, "points = points + VALUES(points)" adds to a balance. Rows of
// one key in one batch are applied in the order they were inserted, as separate statements
// would be. Call it before first use. It panics on an empty clause or one with a
// semicolon. The clause is the plugin's own SQL text, never input.
func (ins *Inserter) OnDuplicateKeyUpdate(assignments string) *Inserter {
	if strings.TrimSpace(assignments) == "" || strings.Contains(assignments, ";") {
		panic(fmt.Sprintf("inbox: inserter of %s: ON DUPLICATE KEY UPDATE %q: want assignments without a semicolon", ins.table, assignments))
	}
	ins.update = assignments
	ins.build()
	return ins
}

// OnConflictUpdate is OnDuplicateKeyUpdate's PostgreSQL form, INSERT … ON CONFLICT
// target DO UPDATE SET assignments. For example:
//
//	balances.OnConflictUpdate("user_id", "points = points_balance.points + EXCLUDED.points")
//
// A column of the row already there is named with the table's name, and the new row's
// with EXCLUDED. On PostgreSQL an Inserter with OnDuplicateKeyUpdate and without
// OnConflictUpdate refuses to insert. PostgreSQL cannot update a row twice in one
// statement. So a batch writes the rows of one conflict key in successive statements, in
// the order they were inserted. OnConflictUpdate panics as OnDuplicateKeyUpdate does, and
// also on a target that is not a list of column names.
func (ins *Inserter) OnConflictUpdate(target, assignments string) *Inserter {
	for _, c := range strings.Split(target, ",") {
		if err := dbx.CheckIdent("conflict target of inserter "+ins.table, strings.TrimSpace(c)); err != nil {
			panic(fmt.Sprintf("inbox: %v", err))
		}
	}
	if strings.TrimSpace(assignments) == "" || strings.Contains(assignments, ";") {
		panic(fmt.Sprintf("inbox: inserter of %s: ON CONFLICT DO UPDATE SET %q: want assignments without a semicolon", ins.table, assignments))
	}
	ins.conflict = "(" + target + ") DO UPDATE SET " + assignments
	ins.target = nil
	for _, c := range strings.Split(target, ",") {
		if i := slices.Index(ins.columns, strings.TrimSpace(c)); i >= 0 {
			ins.target = append(ins.target, i)
		}
	}
	ins.build()
	return ins
}

// text is the INSERT of n rows, in PostgreSQL's form if pg is set, else in the MySQL
// family's.
func (ins *Inserter) text(pg bool) func(n int) string {
	return func(n int) string {
		group := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(ins.columns)), ", ") + ")"
		q := fmt.Sprintf("INSERT INTO %s (%s) VALUES %s", ins.table, strings.Join(ins.columns, ", "),
			strings.TrimSuffix(strings.Repeat(group+", ", n), ", "))
		switch {
		case pg && ins.conflict != "":
			q += " ON CONFLICT " + ins.conflict
		case !pg && ins.update != "":
			q += " ON DUPLICATE KEY UPDATE " + ins.update
		}
		return q
	}
}

// build makes the statements from the settings. With UseStatements it makes only the
// pool's dialect, and otherwise both.
func (ins *Inserter) build() {
	for i, d := range []dbx.Dialect{dbx.MariaDB, dbx.Postgres} {
		ins.insert[i], ins.multi[i] = "", nil
		if ins.dialect != "" && ins.dialect.IsPostgres() != d.IsPostgres() {
			continue
		}
		text := ins.text(d.IsPostgres())
		ins.insert[i] = d.Rebind(text(1))
		ins.multi[i] = dbx.NewMultiRowFor(d, ins.db, len(ins.columns), inserterRows, text)
	}
}

// UseStatements makes the deferred inserts run as prepared statements of pool db, as
// outbox.Writer.UseStatements does. They are dbx.MultiRow statements, prepared in the
// background at their first use. Transactions given to Insert must then belong to db. Call
// it before first use.
func (ins *Inserter) UseStatements(db *sql.DB) *Inserter {
	ins.db, ins.dialect = db, dbx.DialectOf(db)
	ins.build()
	return ins
}

// Close closes the prepared statements of UseStatements.
func (ins *Inserter) Close() error {
	var first error
	for _, m := range ins.multi {
		if m == nil {
			continue
		}
		if err := m.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// family is the index of the statements for a transaction of ctx. It follows the pool of
// UseStatements if there is one, else the inbox that runs the handler.
func (ins *Inserter) family(ctx context.Context) (int, error) {
	d := ins.dialect
	if d == "" {
		d = dialectFrom(ctx)
	}
	if !d.IsPostgres() {
		return 0, nil
	}
	if ins.update != "" && ins.conflict == "" {
		return 1, Permanent(fmt.Errorf("insert into %s: an upsert (OnDuplicateKeyUpdate) without its PostgreSQL form (OnConflictUpdate)", ins.table))
	}
	return 1, nil
}

// Insert inserts one row in tx, its values in the order of the Inserter's columns. The row
// is written at once, or at the end of the group-committed batch ctx belongs to. The
// Inserter's doc says what a deferred row asks of the handler.
func (ins *Inserter) Insert(ctx context.Context, tx *sql.Tx, values ...any) error {
	if len(values) != len(ins.columns) {
		return Permanent(fmt.Errorf("insert into %s: %d values for %d columns (%s)", ins.table, len(values), len(ins.columns), strings.Join(ins.columns, ", ")))
	}
	f, err := ins.family(ctx)
	if err != nil {
		return err
	}
	if s := txdefer.From(ctx, tx); s != nil {
		s.Add(deferredInserts{ins, f}, slices.Clone(values))
		return nil
	}
	if _, err := tx.ExecContext(ctx, ins.insert[f], values...); err != nil {
		return fmt.Errorf("insert into %s: %w", ins.table, err)
	}
	return nil
}

// deferredInserts writes the rows an Inserter deferred into a txdefer.Set.
type deferredInserts struct {
	ins    *Inserter
	family int // as Inserter.family returns it
}

// DeferredTarget implements txdefer.Targeted.
func (d deferredInserts) DeferredTarget() txdefer.Target {
	return txdefer.Target{Table: d.ins.table, Columns: slices.Clone(d.ins.columns)}
}

// FlushDeferred implements txdefer.Flusher.
func (d deferredInserts) FlushDeferred(ctx context.Context, tx *sql.Tx, rows [][]any) error {
	ins := d.ins
	for _, rows := range ins.rounds(d.family, rows) {
		args := make([]any, 0, len(rows)*len(ins.columns))
		for _, r := range rows {
			args = append(args, r...)
		}
		if _, err := ins.multi[d.family].Exec(ctx, tx, args); err != nil {
			return fmt.Errorf("insert %d rows into %s: %w", len(rows), ins.table, err)
		}
	}
	return nil
}

// rounds splits the rows of a PostgreSQL upsert so that no statement has two rows of one
// conflict key. ON CONFLICT DO UPDATE cannot update a row twice in one statement. The n-th
// row of each key goes in the n-th statement, so a key's rows apply in their order. Any
// other insert is one round.
func (ins *Inserter) rounds(family int, rows [][]any) [][][]any {
	if family != 1 || ins.conflict == "" {
		return [][][]any{rows}
	}
	seen := make(map[string]int, len(rows))
	var out [][][]any
	var key strings.Builder
	for _, r := range rows {
		key.Reset()
		for _, i := range ins.target {
			fmt.Fprintf(&key, "%T:%v\x00", r[i], r[i])
		}
		n := seen[key.String()]
		seen[key.String()] = n + 1
		if n == len(out) {
			out = append(out, nil)
		}
		out[n] = append(out[n], r)
	}
	return out
}

// dialectFrom is the dialect withDialect left in ctx, else MariaDB.
func dialectFrom(ctx context.Context) dbx.Dialect {
	if d, ok := dbx.DialectFromContext(ctx); ok {
		return d
	}
	return dbx.MariaDB
}

package dbx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// maxPlaceholders is the most parameters one prepared statement may have. The protocol
// counts them in 16 bits.
const maxPlaceholders = 65535

// MultiRow runs a multi-row statement such as INSERT … VALUES (…), (…), … as server-side
// prepared statements of a few fixed row counts. The counts are the powers of two up to
// Max. Each statement is prepared once per pooled connection, and every later transaction
// on that connection reuses it. MariaDB then parses each shape once. With interpolated
// parameters it would lex every literal of every row of every statement instead. See
// docs/BENCHMARKS.md, section "Prepared multi-row statements (dbx.MultiRow)".
//
// n rows go as the fewest such statements. First come ⌊n/Max⌋ statements of Max rows. Then
// comes at most one statement of each smaller power of two down to MinPrepared, as in a
// binary decomposition. What is left goes as one interpolated statement. The statements run
// in order, so rows keep their order and lock order.
//
// A MultiRow on a pool prepares its statements itself, in the background, when it is first
// used or when Prepare is called. Until then, the statements run interpolated. They also
// do when preparing fails, for example when max_prepared_stmt_count is reached. The result
// is correct either way, only slower.
type MultiRow struct {
	db    *sql.DB
	width int                // parameters per row
	max   int                // most rows per statement, a power of two
	min   int                // fewest rows of a prepared statement, a power of two ≤ max
	text  func(n int) string // the statement for n rows

	prepMu    sync.Mutex // one Prepare at a time
	mu        sync.Mutex // guards the fields below, never held across a round trip
	stmts     map[int]*sql.Stmt
	ready     bool      // every size prepared
	failed    time.Time // the last failed Prepare
	closed    bool
	preparing bool // a background Prepare of prepareSoon is running
}

// NewMultiRow returns a MultiRow on db for rows of width parameters. text(n) is the
// statement for n rows, with '?' placeholders. Dialect.Rebind rebinds it for db's dialect.
// With a nil db the statements always run interpolated, as text gives them. Use
// NewMultiRowFor then. max is the most rows per statement. It is rounded down to a power of
// two and to what the placeholder limit allows.
func NewMultiRow(db *sql.DB, width, max int, text func(n int) string) *MultiRow {
	d := MariaDB
	if db != nil {
		d = DialectOf(db)
	}
	return NewMultiRowFor(d, db, width, max, text)
}

// NewMultiRowFor is NewMultiRow with the dialect given. It serves a db whose dialect is
// known, or a nil db whose statements run in transactions of a pool of dialect d.
func NewMultiRowFor(d Dialect, db *sql.DB, width, max int, text func(n int) string) *MultiRow {
	if width < 1 {
		panic("dbx: MultiRow width below 1")
	}
	if d.IsPostgres() {
		raw := text
		text = func(n int) string { return d.Rebind(raw(n)) }
	}
	max = min(max, maxPlaceholders/width)
	p := 1
	for p*2 <= max {
		p *= 2
	}
	low := 1
	for low < p && low*width < minPreparedParams {
		low *= 2
	}
	return &MultiRow{db: db, width: width, max: p, min: low, text: text, stmts: map[int]*sql.Stmt{}}
}

// minPreparedParams sets the smallest prepared statement. It has the fewest rows, a power
// of two, with at least this many parameters. Fewer rows left over go as one interpolated
// statement. Each prepared statement of a call is one more round trip. Below this size the
// round trip costs more than parsing the rows, and it adds to the batch's latency.
const minPreparedParams = 128

// Max is the most rows one statement carries.
func (m *MultiRow) Max() int { return m.max }

// MinPrepared is the fewest rows of a prepared statement. Fewer rows left over at the end
// of a call go as one interpolated statement.
func (m *MultiRow) MinPrepared() int { return m.min }

// Sizes returns the row counts of the statements that n rows are sent as, in order. First
// come statements of Max rows. Then comes at most one of each smaller power of two down to
// MinPrepared. These are all prepared once Prepare ran. The rest, fewer than MinPrepared,
// go as one interpolated statement.
func (m *MultiRow) Sizes(n int) []int {
	var out []int
	for ; n >= m.max; n -= m.max {
		out = append(out, m.max)
	}
	for p := m.max / 2; p >= m.min; p /= 2 {
		if n >= p {
			out = append(out, p)
			n -= p
		}
	}
	if n > 0 {
		out = append(out, n)
	}
	return out
}

// Exec runs the rows in args, of width parameters each, in tx and returns the rows affected.
func (m *MultiRow) Exec(ctx context.Context, tx *sql.Tx, args []any) (int64, error) {
	var affected int64
	err := m.each(ctx, tx, args, func(st statement, part []any) error {
		res, err := st.exec(ctx, part)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		affected += n
		return err
	})
	return affected, err
}

// Query runs the rows in args in tx, for a statement that returns rows such as INSERT …
// RETURNING. It calls scan for every row the statement returns.
func (m *MultiRow) Query(ctx context.Context, tx *sql.Tx, args []any, scan func(*sql.Rows) error) error {
	return m.each(ctx, tx, args, func(st statement, part []any) error {
		rows, err := st.query(ctx, part)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// statement is one statement of a call, prepared on the transaction's connection. When
// stmt is nil, it runs interpolated from text. The text is built only then, because the
// text of many rows is large.
type statement struct {
	tx   *sql.Tx
	stmt *sql.Stmt
	text func() string
}

func (s statement) exec(ctx context.Context, args []any) (sql.Result, error) {
	if s.stmt != nil {
		return s.stmt.ExecContext(ctx, args...)
	}
	return s.tx.ExecContext(ctx, s.text(), args...)
}

func (s statement) query(ctx context.Context, args []any) (*sql.Rows, error) {
	if s.stmt != nil {
		return s.stmt.QueryContext(ctx, args...)
	}
	return s.tx.QueryContext(ctx, s.text(), args...)
}

// each splits args into statements and calls run with each one and its parameters.
func (m *MultiRow) each(ctx context.Context, tx *sql.Tx, args []any, run func(st statement, part []any) error) error {
	if len(args) == 0 || len(args)%m.width != 0 {
		return fmt.Errorf("dbx: %d parameters are not rows of %d", len(args), m.width)
	}
	for _, n := range m.Sizes(len(args) / m.width) {
		part := args[:n*m.width]
		args = args[n*m.width:]
		st := statement{tx: tx, text: func() string { return m.text(n) }}
		m.mu.Lock()
		ps := m.stmts[n]
		m.mu.Unlock()
		if ps == nil {
			m.prepareSoon()
			if err := run(st, part); err != nil {
				return err
			}
			continue
		}
		// The statement is prepared on tx's own connection the first time, then reused
		// there. db.Prepare must never be called here. It needs a second connection, and a
		// transaction that waits for one while holding its own can deadlock a small pool.
		st.stmt = tx.StmtContext(ctx, ps)
		err := run(st, part)
		_ = st.stmt.Close() // the tx's handle, while the connection keeps the statement
		if tooManyPrepared(err) {
			// Preparing it on this connection failed before it ran. Run it interpolated,
			// and prepare nothing more for a while.
			m.unprepare()
			st.stmt = nil
			err = run(st, part)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// prepareRetry is how long Prepare waits after a failure before it tries again.
const prepareRetry = time.Minute

// prepareTimeout bounds a background Prepare of prepareSoon.
const prepareTimeout = 30 * time.Second

// prepareSoon starts a Prepare on a goroutine of its own. It does not when the statements
// are prepared, being prepared or closed, or when preparing failed within prepareRetry. A
// transaction using the MultiRow never waits for the Prepare, which would need a second
// pooled connection.
func (m *MultiRow) prepareSoon() {
	if m.db == nil {
		return
	}
	m.mu.Lock()
	start := !m.ready && !m.closed && !m.preparing && time.Since(m.failed) >= prepareRetry
	if start {
		m.preparing = true
	}
	m.mu.Unlock()
	if !start {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), prepareTimeout)
		_ = m.Prepare(ctx) // a failure is remembered, so no new try within prepareRetry
		cancel()
		m.mu.Lock()
		m.preparing = false
		m.mu.Unlock()
	}()
}

// Prepare prepares the statements of every size not prepared yet, each on whatever pooled
// connection is free. Later transactions prepare them on their own connections from these.
// The MultiRow does this by itself at its first use. Call Prepare outside any transaction
// of the pool. Until it has succeeded, the statements run interpolated. After a failure it
// does nothing for a minute.
func (m *MultiRow) Prepare(ctx context.Context) error {
	// One Prepare runs at a time, but mu is not held across the round trips. So a
	// transaction looking up a statement in each never waits for a Prepare that waits for a
	// connection.
	if m.db == nil {
		return nil // without a pool, always interpolated
	}
	m.prepMu.Lock()
	defer m.prepMu.Unlock()
	m.mu.Lock()
	skip := m.closed || m.ready || time.Since(m.failed) < prepareRetry
	m.mu.Unlock()
	if skip {
		return nil
	}
	for n := m.max; n >= m.min; n /= 2 {
		m.mu.Lock()
		have := m.stmts[n] != nil
		m.mu.Unlock()
		if have {
			continue
		}
		s, err := m.db.PrepareContext(ctx, m.text(n))
		m.mu.Lock()
		switch {
		case err != nil:
			m.failed = time.Now()
		case m.closed:
			_ = s.Close()
		default:
			m.stmts[n] = s
		}
		m.mu.Unlock()
		if err != nil {
			return fmt.Errorf("prepare the %d-row statement: %w", n, err)
		}
	}
	m.mu.Lock()
	m.ready = !m.closed
	m.mu.Unlock()
	return nil
}

// erMaxPreparedStmtCountReached says that the server's max_prepared_stmt_count is used up.
const erMaxPreparedStmtCountReached = 1461

func tooManyPrepared(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == erMaxPreparedStmtCountReached
}

// unprepare closes the prepared statements after the server refused one more. Prepare
// tries again after prepareRetry.
func (m *MultiRow) unprepare() {
	m.mu.Lock()
	stmts := m.takeStmts()
	m.ready, m.failed = false, time.Now()
	m.mu.Unlock()
	for _, s := range stmts {
		_ = s.Close()
	}
}

// takeStmts empties the statement map and returns what it held. The caller holds mu.
func (m *MultiRow) takeStmts() []*sql.Stmt {
	out := make([]*sql.Stmt, 0, len(m.stmts))
	for n, s := range m.stmts {
		out = append(out, s)
		delete(m.stmts, n)
	}
	return out
}

// Close closes the prepared statements on every connection. Later calls interpolate.
func (m *MultiRow) Close() error {
	m.mu.Lock()
	stmts := m.takeStmts()
	m.closed = true
	m.mu.Unlock()
	var first error
	for _, s := range stmts {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

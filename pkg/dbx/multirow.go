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

// maxPlaceholders is the most parameters one prepared statement may have (the protocol
// counts them in 16 bits).
const maxPlaceholders = 65535

// MultiRow runs a multi-row statement (INSERT … VALUES (…), (…), …) as server-side prepared
// statements of a few fixed row counts — the powers of two up to Max — each prepared once
// per pooled connection and reused by every later transaction on it. MariaDB then parses
// each shape once, instead of lexing every literal of every row of every statement as it
// does with interpolated parameters: the inbox claim of a 512-row batch spent about a
// third of its server time in the parser, and a prepared claim costs ≈12 µs of server CPU
// per row against ≈18.5 interpolated (docs/BENCHMARKS.md, "Prepared multi-row statements").
//
// n rows go as the fewest such statements: ⌊n/Max⌋ of Max rows, then at most one of each
// smaller power of two down to MinPrepared (binary decomposition), then what is left as
// one interpolated statement, in order, so rows keep their order and lock order. A MultiRow
// on a pool prepares its statements itself, in the background, when it is first used (or
// when Prepare is called); until then, and should preparing fail (max_prepared_stmt_count
// reached, say), the statements run interpolated: correct either way, slower.
type MultiRow struct {
	db    *sql.DB
	width int                // parameters per row
	max   int                // most rows per statement: a power of two
	min   int                // fewest rows of a prepared statement: a power of two ≤ max
	text  func(n int) string // the statement for n rows

	prepMu    sync.Mutex // one Prepare at a time
	mu        sync.Mutex // guards the fields below; never held across a round trip
	stmts     map[int]*sql.Stmt
	ready     bool      // every size prepared
	failed    time.Time // the last failed Prepare
	closed    bool
	preparing bool // a background Prepare is running (prepareSoon)
}

// NewMultiRow returns a MultiRow on db for rows of width parameters; text(n) is the
// statement for n rows, with '?' placeholders, rebound for db's dialect (Dialect.Rebind).
// With a nil db the statements always run interpolated, as text gives them (use
// NewMultiRowFor). max is the most rows per statement, rounded down to a power of two and
// to what the placeholder limit allows.
func NewMultiRow(db *sql.DB, width, max int, text func(n int) string) *MultiRow {
	d := MariaDB
	if db != nil {
		d = DialectOf(db)
	}
	return NewMultiRowFor(d, db, width, max, text)
}

// NewMultiRowFor is NewMultiRow with the dialect given: for a nil db (statements run in
// transactions of a pool of dialect d) or one whose dialect is known.
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

// minPreparedParams sets the smallest prepared statement: the fewest rows (a power of two)
// with at least this many parameters. Fewer rows left over go as one interpolated
// statement: each prepared statement of a call is one more round trip, and below this
// size the round trip costs more than parsing the rows (and adds to the batch's latency).
const minPreparedParams = 128

// Max is the most rows one statement carries.
func (m *MultiRow) Max() int { return m.max }

// MinPrepared is the fewest rows of a prepared statement; fewer rows left over at the end
// of a call go as one interpolated statement.
func (m *MultiRow) MinPrepared() int { return m.min }

// Sizes returns the row counts of the statements n rows are sent as, in order: statements
// of Max rows, at most one of each smaller power of two down to MinPrepared (all prepared,
// once Prepare ran), then the rest, fewer than MinPrepared, as one (interpolated).
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

// Exec runs the rows in args (width parameters each) in tx and returns the rows affected.
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

// Query runs the rows in args in tx, a statement that returns rows (INSERT … RETURNING),
// and calls scan for every row it returns.
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

// statement is one statement of a call: prepared on the transaction's connection, or, when
// stmt is nil, interpolated from text (built only then: a 256-row text is ≈12 KB).
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
		// Prepared on tx's own connection the first time, then reused there. (Never
		// db.Prepare here: it needs a second connection, and a transaction that waits for
		// one while holding its own can deadlock a small pool.)
		st.stmt = tx.StmtContext(ctx, ps)
		err := run(st, part)
		_ = st.stmt.Close() // the tx's handle; the connection keeps the statement
		if tooManyPrepared(err) {
			// Preparing it on this connection failed before it ran: run it interpolated,
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

// prepareTimeout bounds a background Prepare (prepareSoon).
const prepareTimeout = 30 * time.Second

// prepareSoon starts a Prepare on a goroutine of its own, unless the statements are
// prepared, being prepared, closed, or failed within prepareRetry: a transaction using the
// MultiRow never waits for it (it would need a second pooled connection).
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
		_ = m.Prepare(ctx) // a failure is remembered: no new try within prepareRetry
		cancel()
		m.mu.Lock()
		m.preparing = false
		m.mu.Unlock()
	}()
}

// Prepare prepares the statements of every size not prepared yet, each on whatever pooled
// connection is free (later transactions prepare them on their own connections from
// these), as the MultiRow does by itself at its first use. Call it outside any transaction
// of the pool; until it has succeeded, the statements run interpolated. After a failure it
// does nothing for a minute.
func (m *MultiRow) Prepare(ctx context.Context) error {
	// One Prepare at a time, but without holding mu across the round trips: a transaction
	// looking up a statement (each) never waits for a Prepare that waits for a connection.
	if m.db == nil {
		return nil // no pool: always interpolated
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

// erMaxPreparedStmtCountReached: the server's max_prepared_stmt_count is used up.
const erMaxPreparedStmtCountReached = 1461

func tooManyPrepared(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == erMaxPreparedStmtCountReached
}

// unprepare closes the prepared statements after the server refused one more; Prepare
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

// takeStmts empties the statement map and returns what it held; mu is held.
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

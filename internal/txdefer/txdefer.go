// Package txdefer lets a write wait until the end of a group-committed transaction, where
// it goes out with the same writes of the transaction's other units of work in one
// multi-row statement.
//
// The inbox's group commit runs many deliveries of a plain handler in one transaction, one
// after another. Each delivery's outbox event would cost an INSERT round trip of its own.
// Instead the Batcher puts a Set for its transaction in the handler's context. A writer that
// knows how to write many rows at once, such as outbox.Writer, hands its row to the Set. The
// Batcher flushes the Set before it marks the batch's inbox rows and commits. A delivery
// rolled back to its savepoint takes its deferred rows with it, by Mark and Truncate.
//
// A writer defers only into a Set of the transaction it is given, as From checks. So a
// handler that opens a transaction of its own writes there at once, as without a Set.
package txdefer

import (
	"context"
	"database/sql"
	"sync"
)

// Flusher writes rows it deferred, in the order given, in tx.
type Flusher interface {
	FlushDeferred(ctx context.Context, tx *sql.Tx, rows [][]any) error
}

// Target names where a Flusher writes its rows. The in-memory mode of inbox/inboxtest
// reads the rows of a Set instead of flushing it, and records them by target.
type Target struct {
	Table   string
	Columns []string // the order of a row's values
	Events  bool     // an outbox.Writer's events (columns event_id, event_type, topic, …)
}

// Targeted is implemented by the Flushers of inbox.Inserter and outbox.Writer.
type Targeted interface {
	DeferredTarget() Target
}

// Row is one deferred row and the Flusher that would write it.
type Row struct {
	Flusher Flusher
	Values  []any
}

type entry struct {
	f   Flusher
	row []any
}

// Set collects the deferred rows of one transaction. It is safe for concurrent use. A
// handler abandoned at its timeout may still add to it while the batch is rolled back.
type Set struct {
	tx      *sql.Tx
	mu      sync.Mutex
	entries []entry
}

// New returns an empty Set for tx.
func New(tx *sql.Tx) *Set { return &Set{tx: tx} }

type ctxKey struct{}

// With returns ctx carrying s.
func With(ctx context.Context, s *Set) context.Context { return context.WithValue(ctx, ctxKey{}, s) }

// From returns the Set ctx carries for tx. It returns nil when ctx carries none, or one of
// another transaction. The caller then writes at once.
func From(ctx context.Context, tx *sql.Tx) *Set {
	s, _ := ctx.Value(ctxKey{}).(*Set)
	if s == nil || s.tx != tx || tx == nil {
		return nil
	}
	return s
}

// Add defers row, to be written by f when the Set is flushed.
func (s *Set) Add(f Flusher, row []any) {
	s.mu.Lock()
	s.entries = append(s.entries, entry{f, row})
	s.mu.Unlock()
}

// Mark returns a position to Truncate back to.
func (s *Set) Mark() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Truncate drops the rows added since mark, for a delivery rolled back to its savepoint.
func (s *Set) Truncate(mark int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mark < len(s.entries) {
		clear(s.entries[mark:])
		s.entries = s.entries[:mark]
	}
}

// Take returns the waiting rows in the order they were added and empties the Set. It
// writes nothing. The in-memory mode of inbox/inboxtest records the rows instead.
func (s *Set) Take() []Row {
	s.mu.Lock()
	entries := s.entries
	s.entries = nil
	s.mu.Unlock()
	rows := make([]Row, len(entries))
	for i, e := range entries {
		rows[i] = Row{Flusher: e.f, Values: e.row}
	}
	return rows
}

// Len returns how many rows wait.
func (s *Set) Len() int { return s.Mark() }

// Flush writes the waiting rows and empties the Set. It writes each Flusher's rows in one
// call, in the order they were added. The Flushers come in the order of their first row.
// After an error the transaction must be rolled back, because some rows may have been
// written.
func (s *Set) Flush(ctx context.Context) error {
	s.mu.Lock()
	entries := s.entries
	s.entries = nil
	s.mu.Unlock()
	if len(entries) == 0 {
		return nil
	}
	var order []Flusher
	rows := map[Flusher][][]any{}
	for _, e := range entries {
		if _, ok := rows[e.f]; !ok {
			order = append(order, e.f)
		}
		rows[e.f] = append(rows[e.f], e.row)
	}
	for _, f := range order {
		if err := f.FlushDeferred(ctx, s.tx, rows[f]); err != nil {
			return err
		}
	}
	return nil
}

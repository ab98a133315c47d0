package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/onceflow/onceflow/internal/txdefer"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// AddBatch stores events in tx with multi-row INSERTs. It is the Add of the group-commit
// path. The inserts are dbx.MultiRow statements of up to 512 rows each, prepared after
// UseStatements. The rows are the ones Add would write, in the order given, so the events
// of one key keep their order in the outbox. A duplicate event id fails the call with
// ErrDuplicateEvent, and the caller must then roll back its transaction.
func (w *Writer) AddBatch(ctx context.Context, tx *sql.Tx, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	w = w.forContext(ctx)
	args, err := batchArgs(ctx, events)
	if err != nil {
		return err
	}
	return w.insertRows(ctx, tx, args, len(events))
}

// batchArgs is the rowArgs of every event, in one slice.
func batchArgs(ctx context.Context, events []Event) ([]any, error) {
	args := make([]any, 0, len(events)*rowWidth)
	var prev []any
	for _, e := range events {
		n := len(args)
		var err error
		if args, err = appendRowArgs(ctx, args, e, prev); err != nil {
			return nil, err
		}
		prev = args[n:]
	}
	return args, nil
}

// insertRows writes n rows whose values are args, in multi-row INSERTs. A batch of the
// inbox's group commit carries its txdefer.Commit in ctx. When such a batch runs on the pool
// of an exactly-once relay of this process, the inserts return each row's id and key hash.
// The rows then go to that relay once the batch commits, by the hand-off of handoff.go.
func (w *Writer) insertRows(ctx context.Context, tx *sql.Tx, args []any, n int) error {
	var err error
	if h, c := w.handoffFor(ctx, tx); h != nil {
		err = w.insertHanded(ctx, tx, args, n, h, c)
	} else {
		_, err = w.batch.Exec(ctx, tx, args)
	}
	if err != nil {
		if dbx.IsDuplicate(err) {
			return fmt.Errorf("%w: %w", ErrDuplicateEvent, err)
		}
		return fmt.Errorf("outbox: insert %d events: %w", n, err)
	}
	return nil
}

// handoffFor returns the hand-off the rows of tx go to, and tx's txdefer.Commit. It
// returns nils when there is none.
func (w *Writer) handoffFor(ctx context.Context, tx *sql.Tx) (*handoff, *txdefer.Commit) {
	if w.handed == nil {
		return nil, nil
	}
	h := lookupHandoff(w.db, w.table)
	if h == nil {
		return nil, nil
	}
	c := txdefer.CommitFrom(ctx, tx)
	// The ids of a transaction of another pool are not the relay's rows.
	if c == nil || c.Pool() != w.db || !w.strict(ctx, tx) {
		return nil, nil
	}
	return h, c
}

// strict reports whether the server stores a row's values as given or fails the insert.
// PostgreSQL does, and so does MariaDB in a strict sql_mode, its default. Otherwise the
// server may store a changed value, such as a truncated payload or a '?' for a byte that is
// not UTF-8. The row is then read back as stored instead of handed over as given. strict
// asks on tx's session until it gets an answer, and remembers it.
func (w *Writer) strict(ctx context.Context, tx *sql.Tx) bool {
	if w.dl.IsPostgres() {
		return true
	}
	if v := w.strictMode.Load(); v != 0 {
		return v > 0
	}
	var mode string
	if err := tx.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil {
		return false // asked again next time
	}
	ok := strings.Contains(mode, "STRICT_TRANS_TABLES") || strings.Contains(mode, "STRICT_ALL_TABLES")
	v := int32(-1)
	if ok {
		v = 1
	}
	w.strictMode.Store(v)
	return ok
}

// insertHanded writes the rows with RETURNING and hands them to h once tx commits. Each row
// gets a copy of its payload, because the caller may reuse its buffers once the insert
// returned.
func (w *Writer) insertHanded(ctx context.Context, tx *sql.Tx, args []any, n int, h *handoff, c *txdefer.Commit) error {
	ids, hashes := make([]int64, 0, n), make([]int64, 0, n)
	var (
		id, hash int64
		eventID  sql.RawBytes
		misorder bool
	)
	err := w.handed.Query(ctx, tx, args, func(rows *sql.Rows) error {
		if err := rows.Scan(&id, &hash, &eventID); err != nil {
			return fmt.Errorf("read inserted outbox rows: %w", err)
		}
		if i := len(ids); i >= n {
			misorder = true
		} else if e, _ := args[i*rowWidth].(string); e != string(eventID) {
			misorder = true
		}
		ids, hashes = append(ids, id), append(hashes, hash)
		return nil
	})
	if err != nil || misorder || len(ids) != n {
		return err // rows out of the insert's order are read back, not handed
	}
	for i := range n {
		if !w.dl.IsPostgres() && uint32(hashes[i]) != crc32.ChecksumIEEE(rawOf(args[i*rowWidth+3])) {
			return nil // key_hash = CRC32(msg_key) shows a key stored changed, so read back
		}
		// Each handed row gets its own copy of its payload. The caller may reuse its buffer
		// once the insert returned, and a dropped row frees its copy.
		if p, _ := args[i*rowWidth+4].([]byte); len(p) > 0 {
			args[i*rowWidth+4] = bytes.Clone(p)
		}
	}
	c.After(func() { h.put(ids, hashes, args) })
	return nil
}

// deferredEvents writes the rows a Writer's Add deferred into a txdefer.Set.
type deferredEvents struct{ w *Writer }

// DeferredTarget implements txdefer.Targeted.
func (d deferredEvents) DeferredTarget() txdefer.Target {
	return txdefer.Target{Table: d.w.table, Columns: strings.Split(writerColumns, ", "), Events: true}
}

// FlushDeferred implements txdefer.Flusher.
func (d deferredEvents) FlushDeferred(ctx context.Context, tx *sql.Tx, rows [][]any) error {
	w := d.w.forContext(ctx)
	args := make([]any, 0, len(rows)*rowWidth)
	for _, r := range rows {
		args = append(args, r...)
	}
	return w.insertRows(ctx, tx, args, len(rows))
}

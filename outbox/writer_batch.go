package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/internal/txdefer"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// AddBatch stores events in tx with multi-row INSERTs (dbx.MultiRow: up to 512 rows each,
// prepared after UseStatements): the group-commit path's Add. The rows are the ones Add
// would write, in the order given (so events of one key keep their order in the outbox). A
// duplicate event id fails the call with ErrDuplicateEvent, and the caller's transaction
// must then be rolled back.
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

// insertRows writes n rows whose values are args, in multi-row INSERTs.
func (w *Writer) insertRows(ctx context.Context, tx *sql.Tx, args []any, n int) error {
	if _, err := w.batch.Exec(ctx, tx, args); err != nil {
		if dbx.IsDuplicate(err) {
			return fmt.Errorf("%w: %w", ErrDuplicateEvent, err)
		}
		return fmt.Errorf("outbox: insert %d events: %w", n, err)
	}
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

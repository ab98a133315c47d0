package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// AddBatch stores events in tx with one multi-row INSERT: the group-commit path's Add. The
// rows are the ones Add would write, in the order given (so events of one key keep their
// order in the outbox). A duplicate event id fails the whole statement with
// ErrDuplicateEvent, and the caller's transaction must then be rolled back.
func (w *Writer) AddBatch(ctx context.Context, tx *sql.Tx, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	args := make([]any, 0, len(events)*6)
	for _, e := range events {
		row, err := rowArgs(e)
		if err != nil {
			return err
		}
		args = append(args, row...)
	}
	var err error
	if w.batch != nil {
		_, err = w.batch.Exec(ctx, tx, args)
	} else {
		head, group := w.insertParts()
		_, err = tx.ExecContext(ctx, head+strings.TrimSuffix(strings.Repeat(group+", ", len(events)), ", "), args...)
	}
	if err != nil {
		if dbx.IsDuplicate(err) {
			return fmt.Errorf("%w: %w", ErrDuplicateEvent, err)
		}
		return fmt.Errorf("outbox: insert %d events: %w", len(events), err)
	}
	return nil
}

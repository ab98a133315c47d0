// Package outbox stores events in the caller's database transaction and relays them to
// Kafka afterwards, so an event exists exactly when the business change that caused it
// committed. The event id is stable (chosen by the caller, deterministic for onceflow's
// own events) and travels as the Kafka header "event_id"; the Kafka key is the aggregate id
// so events of one aggregate stay in order on one partition.
//
// The package knows no domain and does not import inbox.
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/pkg/txdefer"
)

// HeaderEventID and HeaderEventType are the Kafka headers every relayed event carries.
const (
	HeaderEventID   = "event_id"
	HeaderEventType = "event_type"
)

// Event is one message to publish.
type Event struct {
	ID      string            // stable event id, at most 36 bytes (a UUID)
	Type    string            // e.g. "CouponGranted"
	Topic   string            // Kafka topic
	Key     string            // Kafka key: the aggregate id
	Payload []byte            // message value
	Headers map[string]string // extra headers
}

// Validate checks an event before it is stored.
func (e Event) Validate() error {
	switch {
	case e.ID == "" || len(e.ID) > 36:
		return fmt.Errorf("outbox: event id %q must be 1..36 bytes", e.ID)
	case e.Type == "" || len(e.Type) > 64:
		return fmt.Errorf("outbox: event type %q must be 1..64 bytes", e.Type)
	case e.Key == "" || len(e.Key) > 191:
		return fmt.Errorf("outbox: event key %q must be 1..191 bytes", e.Key)
	}
	if err := kafkax.CheckTopicName(e.Topic); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	// The relay appends the extra headers after its own: a second event_id would shadow
	// the real one for readers that keep the last value (watermill metadata, ReadAll).
	for _, k := range []string{HeaderEventID, HeaderEventType} {
		if _, ok := e.Headers[k]; ok {
			return fmt.Errorf("outbox: event %s: header %q is reserved", e.ID, k)
		}
	}
	return nil
}

// ErrDuplicateEvent is returned by Add when an event with the same id is already stored.
var ErrDuplicateEvent = errors.New("outbox: event id already stored")

// Writer adds events to the outbox table within the caller's transaction.
type Writer struct {
	insert string
	batch  *dbx.MultiRow // AddBatch's insert; prepared on a pool after UseStatements
}

// batchRows is the most events one statement of AddBatch carries.
const batchRows = 512

// UseStatements makes AddBatch run its insert as prepared statements of pool db
// (dbx.MultiRow): transactions given to AddBatch must then be db's. Call it before first
// use, and PrepareStatements outside any transaction before each batch; until that has
// succeeded the inserts run interpolated, as without it.
func (w *Writer) UseStatements(db *sql.DB) *Writer {
	w.batch = w.newBatch(db)
	return w
}

// newBatch builds AddBatch's insert on pool db (nil: interpolated).
func (w *Writer) newBatch(db *sql.DB) *dbx.MultiRow {
	i := strings.LastIndex(w.insert, "VALUES ")
	head, group := w.insert[:i+len("VALUES ")], w.insert[i+len("VALUES "):]
	return dbx.NewMultiRow(db, 6, batchRows, func(n int) string {
		return head + strings.TrimSuffix(strings.Repeat(group+", ", n), ", ")
	})
}

// PrepareStatements prepares AddBatch's statements (see UseStatements); outside any
// transaction of the pool.
func (w *Writer) PrepareStatements(ctx context.Context) error {
	return w.batch.Prepare(ctx)
}

// Close closes the prepared statements of UseStatements.
func (w *Writer) Close() error {
	return w.batch.Close()
}

// NewWriter builds a Writer for table (default "outbox").
func NewWriter(table string) (*Writer, error) {
	if table == "" {
		table = "outbox"
	}
	if err := dbx.CheckIdent("outbox table", table); err != nil {
		return nil, err
	}
	w := &Writer{insert: fmt.Sprintf(
		"INSERT INTO %s (event_id, event_type, topic, msg_key, payload, headers) VALUES (?, ?, ?, ?, ?, ?)", table)}
	w.batch = w.newBatch(nil)
	return w, nil
}

// rowArgs validates e and returns the values of its row, in the insert's column order.
func rowArgs(e Event) ([]any, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	var headers any
	if len(e.Headers) > 0 {
		b, err := json.Marshal(e.Headers)
		if err != nil {
			return nil, fmt.Errorf("outbox: headers: %w", err)
		}
		headers = string(b)
	}
	payload := e.Payload
	if payload == nil {
		payload = []byte{} // a nil []byte is sent as NULL, and payload is NOT NULL
	}
	return []any{e.ID, e.Type, e.Topic, e.Key, payload, headers}, nil
}

// Add stores e in tx. It commits or rolls back with the caller's business change.
//
// In a batch of the inbox's group commit (a plain handler run by an inbox.Batcher), ctx
// carries the batch's txdefer.Set: Add checks e at once and its row is written with the
// batch's other events in one multi-row INSERT at the end of the batch, before it commits
// (docs/BENCHMARKS.md, "Deferred outbox rows"). A duplicate event id then fails the batch,
// whose deliveries run again one transaction each, where Add returns ErrDuplicateEvent as
// here. So a Handle must not read back, in the same transaction, the outbox rows it added.
func (w *Writer) Add(ctx context.Context, tx *sql.Tx, e Event) error {
	args, err := rowArgs(e)
	if err != nil {
		return err
	}
	if s := txdefer.From(ctx, tx); s != nil {
		s.Add(w, args)
		return nil
	}
	if _, err := tx.ExecContext(ctx, w.insert, args...); err != nil {
		if dbx.IsDuplicate(err) {
			return fmt.Errorf("%w: %s", ErrDuplicateEvent, e.ID)
		}
		return fmt.Errorf("outbox: insert event %s: %w", e.ID, err)
	}
	return nil
}

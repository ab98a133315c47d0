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
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/internal/txdefer"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
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
	// TraceParent is the W3C traceparent stored with the event (column trace_parent) and
	// written by the relay as the record's traceparent header. Empty: the span context of the
	// ctx given to Add or AddBatch, if it has one (an inbox that traces puts the handler's
	// span there); none, and the record has no such header. A BatchHandler sets it per event
	// from its delivery (inbox.Delivery.TraceParent), as its one ctx is the whole batch's.
	TraceParent string
}

// Validate checks an event before it is stored. Its errors wrap ErrInvalidEvent and say
// they are permanent (see ErrInvalidEvent).
func (e Event) Validate() error {
	switch {
	case e.ID == "" || len(e.ID) > 36:
		return invalid(nil, "outbox: event id %q is %d bytes, must be 1..36 (outbox.EventID makes a 36-byte id from longer parts)", e.ID, len(e.ID))
	case e.Type == "" || len(e.Type) > 64:
		return invalid(nil, "outbox: event type %q must be 1..64 bytes", e.Type)
	case e.Key == "" || len(e.Key) > 191:
		return invalid(nil, "outbox: event key %q must be 1..191 bytes", e.Key)
	}
	if err := kafkax.CheckTopicName(e.Topic); err != nil {
		return invalid(err, "outbox: %v", err)
	}
	if _, ok := tracex.Parse(e.TraceParent); e.TraceParent != "" && (!ok || len(e.TraceParent) != tracex.Len) {
		return invalid(nil, "outbox: event %s: trace parent %q is not a version 00 W3C traceparent", e.ID, e.TraceParent)
	}
	// The relay appends the extra headers after its own: a second event_id would shadow
	// the real one for readers that keep the last value (watermill metadata, ReadAll).
	for _, k := range []string{HeaderEventID, HeaderEventType} {
		if _, ok := e.Headers[k]; ok {
			return invalid(nil, "outbox: event %s: header %q is reserved", e.ID, k)
		}
	}
	return nil
}

// ErrInvalidEvent is wrapped by every error of Event.Validate, so by Add and AddBatch when
// they refuse an event before writing anything. The event itself is wrong: the same event
// is refused on every attempt. These errors also have a method Permanent() bool that
// returns true, which an error classifier can find with errors.As without importing outbox.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// invalidEvent is an error of Event.Validate.
type invalidEvent struct {
	msg   string
	cause error // the check's own error, if any
}

func (e *invalidEvent) Error() string        { return e.msg }
func (e *invalidEvent) Unwrap() error        { return e.cause }
func (e *invalidEvent) Is(target error) bool { return target == ErrInvalidEvent }

// Permanent reports that retrying cannot fix the error: the event is refused as it is.
func (e *invalidEvent) Permanent() bool { return true }

// invalid is an invalidEvent with the message of format and args, wrapping cause.
func invalid(cause error, format string, args ...any) error {
	return &invalidEvent{msg: fmt.Sprintf(format, args...), cause: cause}
}

// ErrDuplicateEvent is returned by Add when an event with the same id is already stored.
var ErrDuplicateEvent = errors.New("outbox: event id already stored")

// Writer adds events to the outbox table within the caller's transaction. It writes the
// MySQL family's SQL unless it is given a pool (UseStatements), told the dialect
// (WithDialect), or called with a context that carries one (dbx.ContextWithDialect, as the
// inbox's handlers get): a *sql.Tx does not say which database it belongs to.
type Writer struct {
	table  string
	dl     dbx.Dialect
	fixed  bool          // dl was given (UseStatements, WithDialect): the context's is not asked
	db     *sql.DB       // the pool of UseStatements, if any
	insert string        // one row, run at once
	batch  *dbx.MultiRow // AddBatch's insert; prepared on db, if set
	// handed is batch returning each row's id and key hash, for a relay's hand-off
	// (handoff.go): MariaDB and PostgreSQL (INSERT … RETURNING), on db only.
	handed     *dbx.MultiRow
	strictMode atomic.Int32 // the server's sql_mode is strict: 1, not: -1, not asked yet: 0

	pgOnce sync.Once
	pg     *Writer // the same Writer in PostgreSQL's SQL, for contexts that say so
}

// batchRows is the most events one statement of AddBatch carries.
const batchRows = 512

// UseStatements makes AddBatch (and the deferred rows of Add in a group-committed batch)
// run their inserts as prepared statements of pool db (dbx.MultiRow, prepared in the
// background at their first use): transactions given to the Writer must then be db's. It
// takes db's dialect too (dbx.DialectOf), as WithDialect. Call it before first use.
func (w *Writer) UseStatements(db *sql.DB) *Writer {
	w.db, w.dl, w.fixed = db, dbx.DialectOf(db), true
	w.build()
	return w
}

// WithDialect makes the Writer write d's SQL (PostgreSQL's placeholders): for a Writer
// whose transactions are a PostgreSQL pool's and that has no UseStatements. Call it before
// first use.
func (w *Writer) WithDialect(d dbx.Dialect) *Writer {
	w.dl, w.fixed = d, true
	w.build()
	return w
}

// forContext is the Writer whose SQL is the dialect ctx carries, unless w's was given.
func (w *Writer) forContext(ctx context.Context) *Writer {
	if w.fixed {
		return w
	}
	if d, ok := dbx.DialectFromContext(ctx); ok && d.IsPostgres() {
		w.pgOnce.Do(func() {
			w.pg = &Writer{table: w.table, dl: dbx.Postgres, fixed: true}
			w.pg.build()
		})
		return w.pg
	}
	return w
}

// build makes the statements of table in the Writer's dialect, AddBatch's on pool w.db
// (nil: interpolated).
func (w *Writer) build() {
	head := fmt.Sprintf("INSERT INTO %s (%s) VALUES ", w.table, writerColumns)
	const group = "(?, ?, ?, ?, ?, ?, ?)"
	w.insert = w.dl.Rebind(head + group)
	w.batch = dbx.NewMultiRow(w.db, rowWidth, batchRows, func(n int) string {
		return w.dl.Rebind(head + strings.TrimSuffix(strings.Repeat(group+", ", n), ", "))
	})
	w.handed = nil
	if w.db != nil && w.dl.Returning() {
		w.handed = dbx.NewMultiRow(w.db, rowWidth, batchRows, func(n int) string {
			return w.dl.Rebind(head + strings.TrimSuffix(strings.Repeat(group+", ", n), ", ") + " RETURNING id, key_hash, event_id")
		})
	}
}

// Close closes the prepared statements of UseStatements.
func (w *Writer) Close() error {
	err := w.batch.Close()
	if w.handed != nil {
		err = errors.Join(err, w.handed.Close())
	}
	return err
}

// NewWriter builds a Writer for table (default "outbox"), in the MySQL family's SQL (see
// UseStatements and WithDialect for PostgreSQL).
func NewWriter(table string) (*Writer, error) {
	if table == "" {
		table = "outbox"
	}
	if err := dbx.CheckIdent("outbox table", table); err != nil {
		return nil, err
	}
	w := &Writer{table: table, dl: dbx.MariaDB}
	w.build()
	return w, nil
}

// writerColumns are the columns the insert writes per event, in rowArgs' order.
const writerColumns = "event_id, event_type, topic, msg_key, payload, headers, trace_parent"

// rowWidth is the number of columns the insert writes per event.
const rowWidth = 7

// rowArgs validates e and returns the values of its row, in the insert's column order; the
// trace parent is e's, else that of ctx's span (NULL when neither has one).
func rowArgs(ctx context.Context, e Event) ([]any, error) {
	return appendRowArgs(ctx, make([]any, 0, rowWidth), e, nil)
}

// appendRowArgs is rowArgs appending to args. prev, when not nil, is the previous row's
// values in args: a type or topic equal to its own is shared, not boxed again (an
// interface holding a string never changes).
func appendRowArgs(ctx context.Context, args []any, e Event, prev []any) ([]any, error) {
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
	var traceParent any
	if e.TraceParent != "" {
		traceParent = e.TraceParent
	} else if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		traceParent = tracex.TraceParent(sc)
	}
	var typ, topic any
	if prev != nil {
		if p, _ := prev[1].(string); p == e.Type {
			typ = prev[1]
		}
		if p, _ := prev[2].(string); p == e.Topic {
			topic = prev[2]
		}
	}
	if typ == nil {
		typ = e.Type
	}
	if topic == nil {
		topic = e.Topic
	}
	return append(args, e.ID, typ, topic, e.Key, payload, headers, traceParent), nil
}

// Add stores e in tx. It commits or rolls back with the caller's business change.
//
// In a batch of the inbox's group commit (a plain handler run by an inbox.Batcher), ctx
// carries the batch's txdefer.Set: Add checks e at once and its row is written with the
// batch's other events in one multi-row INSERT at the end of the batch, before it commits
// (docs/BENCHMARKS.md, "Deferred outbox rows"). A duplicate event id then fails the batch,
// whose deliveries run again one transaction each, where Add returns ErrDuplicateEvent as
// here. So a Handle must not read back, in the same transaction, the outbox rows it added.
// On PostgreSQL a failed insert (ErrDuplicateEvent too) aborts tx: roll it back (or to a
// savepoint taken before Add).
func (w *Writer) Add(ctx context.Context, tx *sql.Tx, e Event) error {
	w = w.forContext(ctx)
	args, err := rowArgs(ctx, e)
	if err != nil {
		return err
	}
	if s := txdefer.From(ctx, tx); s != nil {
		s.Add(deferredEvents{w}, args)
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

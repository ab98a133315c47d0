// Package outbox stores events in the caller's database transaction and relays them to
// Kafka afterwards. An event exists exactly when the business change that caused it
// committed. The event id is stable. The caller chooses it, and onceflow's own events take it
// from EventID. It travels as the Kafka header "event_id". The Kafka key is the
// aggregate id, so the events of one aggregate stay in order on one partition.
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
	// TraceParent is the W3C traceparent stored with the event in column trace_parent. The
	// relay writes it as the record's traceparent header. When it is empty, Add and AddBatch
	// take the span context of their ctx, if it has one. An inbox that traces puts the
	// handler's span there. With neither, the record has no traceparent header. A BatchHandler
	// sets it per event from inbox.Delivery.TraceParent, because its one ctx is the whole
	// batch's.
	TraceParent string
}

// Validate checks an event before it is stored. Its errors wrap ErrInvalidEvent and are
// permanent. See ErrInvalidEvent.
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
	// The relay appends the extra headers after its own. A second event_id would shadow
	// the real one for readers that keep the last value, such as watermill metadata and
	// ReadAll.
	for _, k := range []string{HeaderEventID, HeaderEventType} {
		if _, ok := e.Headers[k]; ok {
			return invalid(nil, "outbox: event %s: header %q is reserved", e.ID, k)
		}
	}
	return nil
}

// ErrInvalidEvent is wrapped by every error of Event.Validate. So it is wrapped by the
// errors of Add and AddBatch when they refuse an event before writing anything. The event
// itself is wrong, so it is refused on every attempt. These errors also have a Permanent
// method that returns true. An error classifier finds it with errors.As without importing
// outbox.
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

// Writer adds events to the outbox table within the caller's transaction. A *sql.Tx does
// not say which database it belongs to, so the Writer writes the MySQL family's SQL by
// default. UseStatements gives it a pool and WithDialect names the dialect. A context made
// by dbx.ContextWithDialect carries the dialect too, and the inbox's handlers get one.
type Writer struct {
	table  string
	dl     dbx.Dialect
	fixed  bool          // dl was given, so the context's dialect is not asked
	db     *sql.DB       // the pool of UseStatements, if any
	insert string        // one row, run at once
	batch  *dbx.MultiRow // AddBatch's insert; prepared on db, if set
	// handed is batch with a RETURNING clause. It gives each row's id and key hash to a
	// relay's hand-off, in handoff.go. It exists only on pool db, and only on MariaDB and
	// PostgreSQL, which have RETURNING.
	handed     *dbx.MultiRow
	strictMode atomic.Int32 // 1 if the server's sql_mode is strict, -1 if not, 0 if not asked yet

	pgOnce sync.Once
	pg     *Writer // the same Writer in PostgreSQL's SQL, for contexts that say so
}

// batchRows is the most events one statement of AddBatch carries.
const batchRows = 512

// UseStatements makes AddBatch run its inserts as prepared statements of pool db. The
// deferred rows of Add in a group-committed batch use them too. They are dbx.MultiRow
// statements, prepared in the background at their first use. Transactions given to the
// Writer must then belong to db. UseStatements also takes db's dialect, as WithDialect
// does. Call it before first use.
func (w *Writer) UseStatements(db *sql.DB) *Writer {
	w.db, w.dl, w.fixed = db, dbx.DialectOf(db), true
	w.build()
	return w
}

// WithDialect makes the Writer write d's SQL, such as PostgreSQL's placeholders. It serves
// a Writer without UseStatements whose transactions belong to a PostgreSQL pool. Call it
// before first use.
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

// build makes the statements of table in the Writer's dialect. AddBatch's statements are
// prepared on pool w.db, and run interpolated when w.db is nil.
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

// NewWriter builds a Writer for table, "outbox" by default. It writes the MySQL family's
// SQL. UseStatements and WithDialect make it write PostgreSQL's.
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

// rowArgs validates e and returns the values of its row in the insert's column order. The
// trace parent is e's, else that of ctx's span, else NULL.
func rowArgs(ctx context.Context, e Event) ([]any, error) {
	return appendRowArgs(ctx, make([]any, 0, rowWidth), e, nil)
}

// appendRowArgs is rowArgs appending to args. When prev is not nil, it holds the previous
// row's values in args. A type or topic equal to prev's shares prev's value instead of
// boxing the string again. An interface holding a string never changes.
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
// A plain handler run by an engine.Batcher is in a batch of the inbox's group commit. Its
// ctx carries the batch's txdefer.Set. Add then checks e at once and writes its row later,
// with the batch's other events, in one multi-row INSERT before the batch commits. See
// docs/BENCHMARKS.md, section "Deferred outbox rows in a grouped batch". A duplicate event
// id then fails the batch. Its deliveries run again in one transaction each, where Add
// returns ErrDuplicateEvent. So a Handle must not read back the outbox rows it added in
// the same transaction.
//
// On PostgreSQL a failed insert aborts tx, and so does ErrDuplicateEvent. Roll tx back, or
// roll back to a savepoint taken before Add.
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

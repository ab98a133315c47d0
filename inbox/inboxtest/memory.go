package inboxtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/txdefer"
)

// The in-memory mode serves a plugin's first unit test, without a database. InMemory runs
// one message through a handler as the inbox runs a new business key. It runs Decode, then
// Handle step by step until Done. A Continue commits the step and calls Handle again. The
// transactions write nothing. InMemory records instead the rows the handler inserts
// through an inbox.Inserter and the events it adds through an outbox.Writer. It records a
// step's rows and events only when the step returns without error, as its commit would.
//
// The in-memory mode does not show what the inbox adds on a database. That covers
// duplicates, concurrent copies, rolled-back commits, the tables' constraints and an
// upsert's effect. An Inserter's ON DUPLICATE KEY UPDATE row is recorded as inserted. Run
// shows all of that, on a real database.
//
// A handler that runs SQL of its own, such as tx.ExecContext or a query, fails its step
// with ErrOwnSQL. Test such a handler with Run.

// ErrOwnSQL is the error of a statement a handler ran on its transaction itself in the
// in-memory mode, which records only Inserter rows and outbox events.
var ErrOwnSQL = errors.New("inboxtest: the in-memory mode runs no SQL of the handler's own (only inbox.Inserter rows and outbox.Writer events are recorded): test this handler with inboxtest.Run on a database")

// MaxSteps is the most Handle calls InMemory makes for one message. A handler that always
// answers Continue fails.
const MaxSteps = 100

// Outcome is what InMemory saw the handler do with one message.
type Outcome struct {
	Key         string // the business key Decode returned
	Fingerprint string
	// Poison reports that Decode refused the message, and Err wraps inbox.ErrPoison. The
	// inbox quarantines such a message and never calls Handle.
	Poison bool
	// Steps is how many Handle calls were made. The last one failed when Err is set.
	Steps    int
	Progress inbox.Progress // what the last Handle call returned
	// Err is Decode's error when Poison is set, or the error of the failed step. A step
	// fails with a panic, an invalid Progress, ErrOwnSQL or the handler's own error. When
	// errors.Is(Err, inbox.ErrPermanent), the inbox quarantines the message at once. It
	// retries any other error. A nil Err means the message is done.
	Err error
	// Rows and Events are what the committed steps wrote, in order.
	Rows   []Row
	Events []Event
}

// Row is one row a handler inserted through an inbox.Inserter.
type Row struct {
	Table   string
	Columns []string
	Values  []any // in Columns' order, as given to Insert
}

// Value returns the row's value of column, or nil when the table has no such column.
func (r Row) Value(column string) any {
	for i, c := range r.Columns {
		if c == column {
			return r.Values[i]
		}
	}
	return nil
}

// Event is one event a handler added through an outbox.Writer, as the relay would publish
// it.
type Event struct {
	Table       string // the outbox table
	ID          string // the event_id header
	Type        string
	Topic       string
	Key         string
	Payload     []byte
	Headers     map[string]string
	TraceParent string
}

// Table returns the rows inserted into table.
func (o Outcome) Table(table string) []Row {
	var out []Row
	for _, r := range o.Rows {
		if r.Table == table {
			out = append(out, r)
		}
	}
	return out
}

// EventsOfType returns the events of type typ.
func (o Outcome) EventsOfType(typ string) []Event {
	var out []Event
	for _, e := range o.Events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// InMemory runs msg through h without a database and returns what it did. See ErrOwnSQL
// and Outcome. It fails t only when the mode itself breaks, never for what the handler
// did. The test asserts that on the Outcome.
func InMemory(t testing.TB, h inbox.Handler, msg *message.Message) Outcome {
	t.Helper()
	ctx := context.Background()
	dec, err := decode(h, msg)
	if err != nil {
		return Outcome{Poison: true, Err: err}
	}
	out := Outcome{Key: dec.Key, Fingerprint: dec.Fingerprint}
	db := sql.OpenDB(memConnector{})
	defer db.Close()
	d := &inbox.Delivery{Message: msg, Key: dec.Key, Value: dec.Value, Attempt: 1}
	for step := 0; ; step++ {
		if step == MaxSteps {
			out.Err = fmt.Errorf("inboxtest: %d steps and the handler still answers %s", MaxSteps, inbox.Continue)
			return out
		}
		d.Step, d.Prepared = step, nil
		out.Steps++
		rows, p, err := runStep(ctx, t, db, h, d)
		out.Progress = p
		if err != nil {
			out.Err = err
			return out
		}
		if err := out.record(rows); err != nil {
			t.Fatal(err)
		}
		if p == inbox.Done {
			return out
		}
	}
}

// decode runs h's Decode as the inbox does. An error makes the message poison, and so does
// a key that is empty, longer than inbox.MaxKeyLen or not UTF-8.
func decode(h inbox.Handler, msg *message.Message) (dec inbox.Decoded, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: decode panicked: %v", inbox.ErrPoison, r)
		}
	}()
	dec, err = h.Decode(msg)
	switch {
	case err != nil && errors.Is(err, inbox.ErrPoison):
		return dec, err
	case err != nil:
		return dec, fmt.Errorf("%w: %w", inbox.ErrPoison, err)
	case dec.Key == "" || len(dec.Key) > inbox.MaxKeyLen || !utf8.ValidString(dec.Key):
		return dec, fmt.Errorf("%w: business key %q: want 1..%d bytes of UTF-8", inbox.ErrPoison, dec.Key, inbox.MaxKeyLen)
	}
	return dec, nil
}

// runStep runs one step in a transaction that writes nothing, and returns the rows it
// deferred. The step runs h's Prepare, when h has one, then Handle.
func runStep(ctx context.Context, t testing.TB, db *sql.DB, h inbox.Handler, d *inbox.Delivery) (rows []txdefer.Row, p inbox.Progress, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("inboxtest: handler panicked: %v", r)
		}
	}()
	if pr, ok := h.(inbox.Preparer); ok {
		if err := pr.Prepare(ctx, d); err != nil {
			return nil, 0, fmt.Errorf("prepare: %w", err)
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("inboxtest: in-memory transaction: %v", err)
	}
	defer tx.Rollback()
	set := txdefer.New(tx)
	p, err = h.Handle(txdefer.With(ctx, set), tx, d)
	if err != nil {
		return nil, p, err
	}
	if p != inbox.Done && p != inbox.Continue {
		return nil, p, fmt.Errorf("%w: %s", inbox.ErrInvalidProgress, p)
	}
	return set.Take(), p, nil
}

// record appends a committed step's rows to o.
func (o *Outcome) record(rows []txdefer.Row) error {
	for _, r := range rows {
		tg, ok := r.Flusher.(txdefer.Targeted)
		if !ok {
			return fmt.Errorf("inboxtest: a deferred row of %T, which names no table", r.Flusher)
		}
		target := tg.DeferredTarget()
		if !target.Events {
			o.Rows = append(o.Rows, Row{Table: target.Table, Columns: target.Columns, Values: r.Values})
			continue
		}
		e, err := event(target, r.Values)
		if err != nil {
			return err
		}
		o.Events = append(o.Events, e)
	}
	return nil
}

// event reads an outbox.Writer's row back into an Event.
func event(target txdefer.Target, values []any) (Event, error) {
	e := Event{Table: target.Table}
	for i, c := range target.Columns {
		v := values[i]
		var err error
		switch c {
		case "event_id":
			e.ID, err = text(c, v)
		case "event_type":
			e.Type, err = text(c, v)
		case "topic":
			e.Topic, err = text(c, v)
		case "msg_key":
			e.Key, err = text(c, v)
		case "trace_parent":
			e.TraceParent, err = text(c, v)
		case "payload":
			b, ok := v.([]byte)
			if !ok {
				err = fmt.Errorf("payload is a %T", v)
			}
			e.Payload = b
		case "headers":
			var h string
			if h, err = text(c, v); err == nil && h != "" {
				err = json.Unmarshal([]byte(h), &e.Headers)
			}
		}
		if err != nil {
			return Event{}, fmt.Errorf("inboxtest: outbox row, column %s: %w", c, err)
		}
	}
	return e, nil
}

func text(column string, v any) (string, error) {
	switch s := v.(type) {
	case nil:
		return "", nil
	case string:
		return s, nil
	}
	return "", fmt.Errorf("%s is a %T", column, v)
}

// memConnector is a database/sql driver whose transactions commit nothing and refuse every
// statement. It makes the handler's *sql.Tx in the in-memory mode.
type memConnector struct{}

func (memConnector) Connect(context.Context) (driver.Conn, error) { return memConn{}, nil }
func (memConnector) Driver() driver.Driver                        { return memDriver{} }

type memDriver struct{}

func (memDriver) Open(string) (driver.Conn, error) { return memConn{}, nil }

type memConn struct{}

func (memConn) Prepare(query string) (driver.Stmt, error) {
	return nil, fmt.Errorf("%w; it ran: %.200s", ErrOwnSQL, query)
}
func (memConn) Close() error              { return nil }
func (memConn) Begin() (driver.Tx, error) { return memTx{}, nil }

type memTx struct{}

func (memTx) Commit() error   { return nil }
func (memTx) Rollback() error { return nil }

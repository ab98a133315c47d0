package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"
)

// Progress tells the inbox what to do after a successful Handle call. Its zero value is
// invalid: a handler that returns it (or a HandleBatch that leaves a slot at it) has not
// said what it did, and the inbox never takes that for Done — Handle's attempt fails (its
// step is rolled back and retried, then quarantined), a HandleBatch slot falls back to the
// one-at-a-time path as if left at Continue.
type Progress int

const (
	// Done: the message is fully processed; the inbox row becomes 'done' in the same
	// transaction as the handler's writes.
	Done Progress = iota + 1
	// Continue: commit this step (the inbox row stays 'processing') and call Handle again
	// in a new transaction. Multi-step handlers (state machines) return it after each step
	// so every step commits its side effect with its own state transition.
	Continue
)

// String names the progress ("done", "continue", or "invalid(n)").
func (p Progress) String() string {
	switch p {
	case Done:
		return "done"
	case Continue:
		return "continue"
	}
	return fmt.Sprintf("invalid(%d)", int(p))
}

func (p Progress) valid() bool { return p == Done || p == Continue }

// ErrInvalidProgress is wrapped by the error of an attempt whose Handle returned no error
// and a Progress that is neither Done nor Continue (the zero value, say).
var ErrInvalidProgress = errors.New("handler returned an invalid inbox.Progress (want inbox.Done or inbox.Continue)")

// invalidProgress is the error of a Handle call that returned p.
func invalidProgress(p Progress) error {
	return fmt.Errorf("%w: %s", ErrInvalidProgress, p)
}

// Decoded is what a handler extracts from a message before anything is written.
type Decoded struct {
	// Key is the business key, e.g. the order id. Required; UTF-8, at most MaxKeyLen bytes.
	Key string
	// Fingerprint identifies the payload's meaning. Two deliveries with the same Key and a
	// different Fingerprint are a conflict. Empty means sha256 of the raw payload; one that
	// is not UTF-8 or longer than 64 bytes is stored as its sha256.
	Fingerprint string
	// Value is the decoded payload, handed back to Handle in Delivery.Value.
	Value any

	meta string // the message's metadata as stored (set by the inbox after Decode)
}

// Handler is implemented by a plugin.
type Handler interface {
	// Decode validates a message and extracts its business key. An error means the message
	// is poison: it is quarantined with the error as reason and never retried.
	Decode(msg *message.Message) (Decoded, error)
	// Handle runs one step in tx, which also holds the message's inbox row lock. It must do
	// all its writes through tx and must not commit or roll it back. An error rolls the
	// step back; wrap it with Permanent to quarantine at once instead of retrying. A
	// database's refusal of the step's values (dbx.IsDataError, found through %w) is
	// quarantined at once too, as ReasonData; a handler that expects such a refusal to pass
	// (a foreign key's parent yet to arrive) returns an error that does not wrap it.
	Handle(ctx context.Context, tx *sql.Tx, d *Delivery) (Progress, error)
}

// Source is where a delivery came from.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

// Delivery is one message being processed.
type Delivery struct {
	Message  *message.Message
	BizType  string
	Key      string
	Value    any
	Source   Source
	InboxID  int64
	Attempt  int   // 1-based attempt within this delivery
	Step     int   // 0-based step within this attempt
	ReplayID int64 // non-zero when run by a replay
	Resumed  bool  // the inbox row was already 'processing' when this delivery claimed it
	// Prepared is what the handler's Prepare left for the next Handle call (nil without a
	// Preparer). It is reset before every Prepare.
	Prepared any

	trace trace.SpanContext // the delivery's span, when the inbox traces (TraceParent)

	reply *Reply // set by Respond
	// uncertain: a transaction of this attempt committed some of the delivery's work, or
	// may have (its commit got no answer), so an error after it leaves the outcome open.
	uncertain bool
}

// Preparer is implemented by handlers whose steps call slow outside services. Prepare runs
// before a step's transaction, outside any transaction and without any database lock, so a
// call of seconds (the seed incident's 800 ms–2 s) never holds one: before every step of a
// delivery run one at a time, and, under group commit, before the delivery joins a batch
// (its first step). It may read committed state and must make only idempotent outside
// calls (keyed by business key and step); it leaves what it prepared in d.Prepared. Handle
// (or HandleBatch) then applies the step in the transaction and must re-check that the
// state it prepared for is still current. A failed Prepare (error, panic,
// inbox.handler_timeout) is a failed attempt of the delivery.
//
// Prepare runs under the key's call lease: one path at a time calls out for a key, across
// the partition's delivery, its copies, the delayed redeliverer, replays and other routers.
// It is not called for a key whose row is done, quarantined or another message's. When the
// step's transaction rolls back, the step's next attempt gets what Prepare made in
// d.Prepared again instead of a new call. A call abandoned at inbox.handler_timeout keeps
// the key until it returns.
type Preparer interface {
	Prepare(ctx context.Context, d *Delivery) error
}

// ErrPermanent marks an error that retrying cannot fix.
var ErrPermanent = errors.New("permanent failure")

// permanentError is err marked permanent: it unwraps to err, and is ErrPermanent.
type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() error        { return e.err }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent wraps err so the inbox quarantines the message without further retries.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err: err}
}

// ErrPoison is wrapped by every error that made a message poison (undecodable, oversized).
var ErrPoison = errors.New("poison message")

// PoisonError wraps a decode error.
func PoisonError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrPoison, fmt.Sprintf(format, args...))
}

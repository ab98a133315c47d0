package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/onceflow/onceflow/internal/tracex"
	"go.opentelemetry.io/otel/trace"
)

// Progress tells the inbox what to do after a successful Handle call. Its zero value is
// invalid. A handler that returns it has not said what it did, and neither has a
// HandleBatch that leaves a slot at it. The inbox never takes the zero value for Done. For
// Handle, the attempt fails, so its step is rolled back and retried, then quarantined. A
// HandleBatch slot falls back to the one-at-a-time path, as if it were left at Continue.
type Progress int

const (
	// Done means the message is fully processed. The inbox row becomes 'done' in the same
	// transaction as the handler's writes.
	Done Progress = iota + 1
	// Continue means commit this step and call Handle again in a new transaction. The
	// inbox row stays 'processing'. Multi-step handlers, such as state machines, return it
	// after each step. So every step commits its side effect with its own state transition.
	Continue
)

// String names the progress as "done", "continue" or "invalid(n)".
func (p Progress) String() string {
	switch p {
	case Done:
		return "done"
	case Continue:
		return "continue"
	}
	return fmt.Sprintf("invalid(%d)", int(p))
}

// ErrInvalidProgress is wrapped by the error of an attempt whose Handle returned no error
// and a Progress that is neither Done nor Continue, such as the zero value.
var ErrInvalidProgress = errors.New("handler returned an invalid inbox.Progress (want inbox.Done or inbox.Continue)")

// MaxKeyLen is the longest business key accepted. The unique index must hold the key and
// its suffix.
const MaxKeyLen = 128

// Decoded is what a handler extracts from a message before anything is written.
type Decoded struct {
	// Key is the business key, such as the order id. It is required, and must be UTF-8 of
	// at most MaxKeyLen bytes.
	Key string
	// Fingerprint identifies the payload's meaning. Two deliveries with the same Key and a
	// different Fingerprint are a conflict. An empty Fingerprint stands for the sha256 of
	// the raw payload. A Fingerprint that is not UTF-8, or longer than 64 bytes, is stored
	// as its sha256.
	Fingerprint string
	// Value is the decoded payload, handed back to Handle in Delivery.Value.
	Value any
}

// Handler is implemented by a plugin.
type Handler interface {
	// Decode validates a message and extracts its business key. An error means the message
	// is poison. It is quarantined with the error as its reason and never retried.
	Decode(msg *message.Message) (Decoded, error)
	// Handle runs one step in tx, which also holds the lock of the message's inbox row. It
	// must do all its writes through tx, and must not commit or roll it back. An error
	// rolls the step back. Wrap the error with Permanent to quarantine the message at once
	// instead of retrying. The database may refuse the step's values, as dbx.IsDataError
	// reports through %w wrapping. Such a message is quarantined at once too, with reason
	// "data". A handler may expect such a refusal to pass, as when a foreign key's
	// parent is yet to arrive. It then returns an error that does not wrap the refusal.
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
	Attempt  int   // attempt within this delivery, counted from 1
	Step     int   // step within this attempt, counted from 0
	ReplayID int64 // non-zero when run by a replay
	Resumed  bool  // the inbox row was already 'processing' when this delivery claimed it
	// Prepared is what the handler's Prepare left for the next Handle call. It is nil
	// without a Preparer, and reset before every Prepare.
	Prepared any

	trace trace.SpanContext // the delivery's span when the inbox traces, read by TraceParent
	reply *reply            // the response Respond stated, nil until it does
}

// reply is a command's response as Respond states it.
type reply struct {
	status int
	body   []byte
}

// TraceParent returns the W3C traceparent of the delivery's span, or "" when the inbox does
// not trace. A BatchHandler sets it as outbox.Event.TraceParent on the events it writes for
// the delivery. So each event continues its own delivery's trace, because HandleBatch's
// ctx is the whole batch's.
func (d *Delivery) TraceParent() string { return tracex.TraceParent(d.trace) }

// BatchHandler is the expert path of group commit. It is a handler that finishes many
// deliveries in one transaction, with multi-row statements of its own. It optimises the
// happy path only. Everything unusual still goes through Handle, one delivery at a time. A
// plain Handler needs no BatchHandler to be group-committed.
type BatchHandler interface {
	Handler
	// HandleBatch runs in tx, which holds the inbox row locks of every delivery in ds. The
	// rows are new or unfinished, and their fingerprints match. The keys are distinct and
	// sorted. With a Preparer, ds holds only deliveries whose Prepare succeeded.
	//
	// HandleBatch returns one Progress per delivery. Done means the delivery's work is
	// complete in tx, and the inbox marks its row done in the same transaction. Continue
	// means HandleBatch left the delivery for the one-at-a-time path, which runs Handle
	// after tx committed. A delivery left at Continue must be in a state Handle can resume
	// from. A slot left at the zero Progress, or at any invalid one, is never taken for
	// Done. It falls back as Continue does. An error rolls the whole batch back, and every
	// delivery then takes the one-at-a-time path.
	HandleBatch(ctx context.Context, tx *sql.Tx, ds []*Delivery) ([]Progress, error)
}

// Preparer is implemented by handlers whose steps call slow outside services. Prepare runs
// before a step's transaction, outside any transaction and without any database lock. So a
// call that takes seconds never holds a lock. For a delivery run one at a time, Prepare
// runs before every step. Under group commit, it runs before the delivery joins a batch,
// for its first step.
//
// Prepare may read committed state. It must make only idempotent outside calls, keyed by
// business key and step. It leaves what it prepared in d.Prepared. Handle or HandleBatch
// then applies the step in the transaction. It must check again that the state Prepare
// prepared for is still current. A Prepare that fails is a failed attempt of the delivery.
// It fails by returning an error, by panicking or by running past inbox.handler_timeout.
//
// Prepare runs under the key's call lease. One path at a time calls out for a key. The
// lease covers the partition's delivery, its copies, the delayed redeliverer, replays and
// other routers. Prepare is not called for a key whose row is done, quarantined or
// another message's. When the step's transaction rolls back, the step's next attempt gets
// what Prepare made in d.Prepared again instead of making a new call. A call abandoned at
// inbox.handler_timeout keeps the key until it returns.
type Preparer interface {
	Prepare(ctx context.Context, d *Delivery) error
}

// ErrPermanent marks an error that retrying cannot fix.
var ErrPermanent = errors.New("permanent failure")

// permanentError is err marked permanent. It unwraps to err, and it is ErrPermanent.
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

// ErrPoison is wrapped by every error that made a message poison, such as a message that
// cannot be decoded or is too large.
var ErrPoison = errors.New("poison message")

// PoisonError wraps a decode error.
func PoisonError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrPoison, fmt.Sprintf(format, args...))
}

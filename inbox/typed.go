package inbox

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/jsonkeys"
)

// A typed handler saves a plugin the type assertion Delivery.Value.(T). The plugin gives a
// Codec for its message type T and a function that handles a T. It gets a Handler whose
// Decode runs the codec and whose Handle hands the function the decoded value.
//
//	h := inbox.Typed(inbox.JSON[OrderShipped]{Key: func(o OrderShipped) (string, error) { ... }},
//		func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderShipped) (inbox.Progress, error) { ... })
//
// A typed handler is a plain Handler, so group commit runs it in shared transactions. A handler that also
// makes slow outside calls embeds *TypedHandler[T] and adds a Prepare method, which makes
// it a Preparer.

// Codec decodes the messages of a typed handler into values of T.
type Codec[T any] interface {
	// Decode returns the message's value, its business key and its fingerprint. An empty
	// fingerprint stands for the sha256 of the raw payload. An error makes the message
	// poison. It is quarantined, never retried.
	Decode(msg *message.Message) (v T, key, fingerprint string, err error)
}

// JSON is the default Codec. The payload is one JSON value, decoded into T with
// encoding/json. Fields that T does not know are ignored, because a producer may add
// fields.
//
// JSON refuses anything after the value but white space. Two values, or a value followed
// by garbage, are not the message the producer meant. JSON also refuses a payload that
// encoding/json would not decode as sent, such as bytes that are not UTF-8. CheckJSONText
// finds those. Field names match exactly. JSON refuses a key that names a field of T only
// in another case, such as "ORDERID" for "orderId". It refuses a key given twice in an
// object. encoding/json alone would match the first case-insensitively and keep the last
// of the second.
//
// The plugin gives the Key and Fingerprint functions.
type JSON[T any] struct {
	// Key returns v's business key, such as its order id. It returns an error when v is not
	// a valid message, such as one missing a required field. The error makes the message
	// poison. Key is required.
	Key func(v T) (string, error)
	// Fingerprint returns what v means. Two deliveries of one key with different
	// fingerprints are a conflict, and are quarantined. When Fingerprint is nil, the
	// fingerprint is the sha256 of the raw payload. A producer that encodes the same value
	// differently then makes a conflict.
	Fingerprint func(v T) string
}

// Decode implements Codec.
func (c JSON[T]) Decode(msg *message.Message) (v T, key, fingerprint string, err error) {
	var zero T
	if c.Key == nil {
		return zero, "", "", errors.New("inbox.JSON: no Key function")
	}
	if err := CheckJSONText(msg.Payload); err != nil {
		return zero, "", "", err
	}
	dec := json.NewDecoder(bytes.NewReader(msg.Payload))
	if err := dec.Decode(&v); err != nil {
		return zero, "", "", fmt.Errorf("json: %w", err)
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		return zero, "", "", fmt.Errorf("json: data after the value, which ends at byte %d", end)
	}
	if err := jsonkeys.Check(msg.Payload[:end], reflect.TypeFor[T]()); err != nil {
		return zero, "", "", fmt.Errorf("json: %w", err)
	}
	if key, err = c.Key(v); err != nil {
		return zero, "", "", err
	}
	if c.Fingerprint != nil {
		fingerprint = c.Fingerprint(v)
	}
	return v, key, fingerprint, nil
}

// TypedFunc handles one delivery whose payload decoded to v, as Handler.Handle does. Its
// writes go through tx, and an error rolls the step back. An error wrapped by Permanent
// quarantines the message at once.
type TypedFunc[T any] func(ctx context.Context, tx *sql.Tx, d *Delivery, v T) (Progress, error)

// TypedHandler is a Handler for messages of type T. Its Decode runs its Codec, and its
// Handle calls its TypedFunc with the decoded value. Build one with Typed.
type TypedHandler[T any] struct {
	codec  Codec[T]
	handle TypedFunc[T]
}

var _ Handler = (*TypedHandler[struct{}])(nil)

// Typed returns the Handler of messages that codec decodes into T, handled by handle. It
// panics when codec or handle is nil, or when codec is a JSON without Key. Such a plugin's
// mistake is then found at start-up rather than by quarantining every message.
func Typed[T any](codec Codec[T], handle TypedFunc[T]) *TypedHandler[T] {
	switch c := any(codec).(type) {
	case nil:
		panic("inbox.Typed: nil codec")
	case JSON[T]:
		if c.Key == nil {
			panic("inbox.Typed: inbox.JSON without a Key function")
		}
	case *JSON[T]:
		if c == nil || c.Key == nil {
			panic("inbox.Typed: inbox.JSON without a Key function")
		}
	}
	if handle == nil {
		panic("inbox.Typed: nil handle function")
	}
	return &TypedHandler[T]{codec: codec, handle: handle}
}

// Decode implements Handler. It returns the codec's value, key and fingerprint. A codec
// error makes the message poison.
func (h *TypedHandler[T]) Decode(msg *message.Message) (Decoded, error) {
	v, key, fp, err := h.codec.Decode(msg)
	if err != nil {
		if errors.Is(err, ErrPoison) {
			return Decoded{}, err
		}
		return Decoded{}, fmt.Errorf("%w: %w", ErrPoison, err)
	}
	return Decoded{Key: key, Fingerprint: fp, Value: v}, nil
}

// Handle implements Handler. It calls the TypedFunc with the delivery's decoded value.
func (h *TypedHandler[T]) Handle(ctx context.Context, tx *sql.Tx, d *Delivery) (Progress, error) {
	v, ok := d.Value.(T)
	if !ok {
		var want T
		return 0, Permanent(fmt.Errorf("inbox: delivery %q holds a %T, not the %T this handler decodes", d.Key, d.Value, want))
	}
	return h.handle(ctx, tx, d, v)
}

package coupon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/jsonkeys"
)

// OrderPaid is the order-paid event. Its payload is the JSON object
// {"orderId": "...", "userId": "...", "amountCents": 12345, "paidAt": "RFC3339"}, and its
// Kafka key is the order id.
type OrderPaid struct {
	OrderID     string    `json:"orderId"`
	UserID      string    `json:"userId"`
	AmountCents int64     `json:"amountCents"`
	PaidAt      time.Time `json:"paidAt"`
}

// MaxIDLen bounds orderId and userId.
const MaxIDLen = 64

// ErrBadOrderPaid wraps every reason an order-paid payload is rejected.
var ErrBadOrderPaid = errors.New("bad order-paid payload")

// DecodeOrderPaid parses and validates a payload. Unknown fields are allowed, because
// producers may add some. DecodeOrderPaid refuses wrong types, a missing orderId or userId,
// a negative amount and trailing data. It refuses a field name in another case, such as
// "orderid", and a key given twice. It refuses bytes that are not UTF-8, as
// inbox.CheckJSONText does. Decoded, they would become U+FFFD, and two orders would become
// one.
func DecodeOrderPaid(b []byte) (OrderPaid, error) {
	if err := inbox.CheckJSONText(b); err != nil {
		return OrderPaid{}, fmt.Errorf("%w: %w", ErrBadOrderPaid, err)
	}
	if o, ok := decodeOrderPaidFast(b); ok {
		return o, nil
	}
	return decodeOrderPaidReference(b)
}

// decodeOrderPaidReference decodes with encoding/json what the fast path leaves, including
// every error. The fast path's results are tested against it. b has passed
// inbox.CheckJSONText.
func decodeOrderPaidReference(b []byte) (OrderPaid, error) {
	var raw struct {
		OrderID     *string          `json:"orderId"`
		UserID      *string          `json:"userId"`
		AmountCents *json.RawMessage `json:"amountCents"` // raw, because a json.Number would accept "500"
		PaidAt      *string          `json:"paidAt"`
	}
	// json.Unmarshal rejects anything after the object but whitespace. It also costs much
	// less CPU than a json.Decoder.
	if err := json.Unmarshal(b, &raw); err != nil {
		return OrderPaid{}, fmt.Errorf("%w: %v", ErrBadOrderPaid, err)
	}
	// encoding/json took "ORDERID" for orderId and kept the last of a key given twice.
	if err := jsonkeys.Check(b, reflect.TypeOf(raw)); err != nil {
		return OrderPaid{}, fmt.Errorf("%w: %w", ErrBadOrderPaid, err)
	}
	var o OrderPaid
	if raw.OrderID == nil || *raw.OrderID == "" {
		return o, fmt.Errorf("%w: missing orderId", ErrBadOrderPaid)
	}
	if raw.UserID == nil || *raw.UserID == "" {
		return o, fmt.Errorf("%w: missing userId", ErrBadOrderPaid)
	}
	for _, f := range [2]struct{ name, v string }{{"orderId", *raw.OrderID}, {"userId", *raw.UserID}} {
		if len(f.v) > MaxIDLen || !utf8.ValidString(f.v) {
			return o, fmt.Errorf("%w: %s longer than %d bytes or not UTF-8", ErrBadOrderPaid, f.name, MaxIDLen)
		}
	}
	o.OrderID, o.UserID = *raw.OrderID, *raw.UserID
	if raw.AmountCents != nil {
		n, err := strconv.ParseInt(string(*raw.AmountCents), 10, 64)
		if err != nil || n < 0 {
			return o, fmt.Errorf("%w: amountCents %s is not a non-negative integer", ErrBadOrderPaid, *raw.AmountCents)
		}
		o.AmountCents = n
	}
	if raw.PaidAt != nil {
		t, ok := parsePaidAt(*raw.PaidAt)
		if !ok {
			return o, fmt.Errorf("%w: paidAt %q is not RFC3339", ErrBadOrderPaid, *raw.PaidAt)
		}
		o.PaidAt = t
	}
	return o, nil
}

// parsePaidAt parses an RFC3339 time as UTC. Encode writes the UTC form, which must stay a
// 4-digit RFC3339 year.
func parsePaidAt(s string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if y := t.UTC().Year(); err != nil || y < 0 || y > 9999 {
		return time.Time{}, false
	}
	return t.UTC(), true
}

// Fingerprint identifies the meaning of an order-paid event. The same order delivered
// again has the same fingerprint, even if its field order, spacing or extra fields differ.
// A different user or amount for the same order is a conflict.
func (o OrderPaid) Fingerprint() string {
	// The hashed bytes are orderId NUL userId NUL amountCents NUL paidAt, in UTC and
	// RFC3339Nano.
	var buf [2*MaxIDLen + 64]byte
	b := append(buf[:0], o.OrderID...)
	b = append(append(b, 0), o.UserID...)
	b = strconv.AppendInt(append(b, 0), o.AmountCents, 10)
	b = o.PaidAt.UTC().AppendFormat(append(b, 0), time.RFC3339Nano)
	s := sha256.Sum256(b)
	var h [2 * sha256.Size]byte
	hex.Encode(h[:], s[:])
	return string(h[:])
}

// Encode returns the wire form, which is what json.Marshal makes of the four members in
// this order. Ids of printable ASCII that JSON does not escape are written directly, with
// one allocation.
func (o OrderPaid) Encode() []byte {
	paidAt := o.PaidAt.UTC()
	if !plainJSONText(o.OrderID) || !plainJSONText(o.UserID) {
		b, _ := json.Marshal(struct {
			OrderID     string `json:"orderId"`
			UserID      string `json:"userId"`
			AmountCents int64  `json:"amountCents"`
			PaidAt      string `json:"paidAt"`
		}{o.OrderID, o.UserID, o.AmountCents, paidAt.Format(time.RFC3339Nano)})
		return b
	}
	b := make([]byte, 0, len(`{"orderId":"","userId":"","amountCents":-9223372036854775808,"paidAt":"-2006-01-02T15:04:05.999999999Z"}`)+len(o.OrderID)+len(o.UserID))
	b = append(append(append(b, `{"orderId":"`...), o.OrderID...), `","userId":"`...)
	b = append(append(b, o.UserID...), `","amountCents":`...)
	b = append(strconv.AppendInt(b, o.AmountCents, 10), `,"paidAt":"`...)
	// RFC3339Nano writes only digits, '-', '+', ':', '.', 'T' and 'Z', which JSON does not
	// escape.
	return append(paidAt.AppendFormat(b, time.RFC3339Nano), `"}`...)
}

// plainJSONText reports whether json.Marshal writes s as it is between quotes. That holds
// for printable ASCII without '"', '\\' and the HTML characters '<', '>' and '&', which it
// escapes.
func plainJSONText(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

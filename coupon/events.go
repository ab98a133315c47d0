package coupon

import (
	"crypto/sha1"
	"encoding/json"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Event types written to the outbox.
const (
	EventGranted     = "CouponGranted"
	EventGrantFailed = "CouponGrantFailed"
)

// namespace is the namespace of the deterministic UUIDv5 ids. A retried or resumed grant
// always produces the same coupon id and the same event id, so a duplicate anywhere is
// detectable.
var namespace = uuid.MustParse("6f1c2c1e-6a4f-4a57-9a53-0c9f1d1e0b11")

// CouponID is the deterministic coupon id of an order and a campaign.
func CouponID(orderID, campaignID string) string {
	return nameID("coupon", campaignID, orderID)
}

// EventID is the deterministic id of the event of type typ for an order and a campaign.
func EventID(typ, orderID, campaignID string) string {
	return nameID(typ, campaignID, orderID)
}

// nameID is uuid.NewSHA1 of namespace and "kind NUL campaign NUL order", as text. It hashes
// from a buffer on the stack. The grant path makes two ids per order, and uuid.NewSHA1
// would allocate a hash state and the name for each.
func nameID(kind, campaignID, orderID string) string {
	var buf [256]byte
	b := append(buf[:0], namespace[:]...)
	b = append(append(append(append(append(b, kind...), 0), campaignID...), 0), orderID...)
	sum := sha1.Sum(b)
	var id uuid.UUID
	copy(id[:], sum[:])
	id[6] = (id[6] & 0x0f) | 0x50 // version 5
	id[8] = (id[8] & 0x3f) | 0x80 // RFC 4122 variant
	return id.String()
}

// GrantEvent is the payload of coupon-granted and coupon-grant-failed.
type GrantEvent struct {
	EventID    string    `json:"eventId"`
	OrderID    string    `json:"orderId"`
	UserID     string    `json:"userId"`
	CampaignID string    `json:"campaignId"`
	CouponID   string    `json:"couponId,omitempty"`
	ValueCents int64     `json:"valueCents"`
	GrantedAt  time.Time `json:"grantedAt,omitzero"`
	Reason     string    `json:"reason,omitempty"`
	FailedAt   time.Time `json:"failedAt,omitzero"`
}

// Encode returns the JSON form: the bytes json.Marshal gives. The common event, whose
// strings need no escaping and whose times are in years 0 through 9999, is appended
// directly; any other goes through json.Marshal.
func (e GrantEvent) Encode() []byte {
	if b, ok := e.appendPlain(make([]byte, 0, 320)); ok {
		return b
	}
	b, _ := json.Marshal(e)
	return b
}

// appendPlain appends e's JSON to b, as json.Marshal writes it, and reports true. It reports
// false, and b is to be dropped, when a string holds a byte json.Marshal would escape or
// replace, or a time is one MarshalJSON refuses or writes in a form of its own.
func (e GrantEvent) appendPlain(b []byte) ([]byte, bool) {
	ok := true
	str := func(b []byte, key, v string) []byte {
		if !plainJSON(v) {
			ok = false
		}
		b = append(b, key...)
		b = append(b, '"')
		b = append(b, v...)
		return append(b, '"')
	}
	at := func(b []byte, key string, t time.Time) []byte {
		if y := t.Year(); y < 0 || y > 9999 {
			ok = false
		}
		if _, off := t.Zone(); off%60 != 0 || off <= -24*3600 || off >= 24*3600 {
			ok = false // an offset RFC 3339 cannot write: MarshalJSON cuts or refuses it
		}
		b = append(b, key...)
		b = append(b, '"')
		b = t.AppendFormat(b, time.RFC3339Nano)
		return append(b, '"')
	}
	b = str(b, `{"eventId":`, e.EventID)
	b = str(b, `,"orderId":`, e.OrderID)
	b = str(b, `,"userId":`, e.UserID)
	b = str(b, `,"campaignId":`, e.CampaignID)
	if e.CouponID != "" {
		b = str(b, `,"couponId":`, e.CouponID)
	}
	b = append(b, `,"valueCents":`...)
	b = strconv.AppendInt(b, e.ValueCents, 10)
	if !e.GrantedAt.IsZero() {
		b = at(b, `,"grantedAt":`, e.GrantedAt)
	}
	if e.Reason != "" {
		b = str(b, `,"reason":`, e.Reason)
	}
	if !e.FailedAt.IsZero() {
		b = at(b, `,"failedAt":`, e.FailedAt)
	}
	return append(b, '}'), ok
}

// plainJSON reports whether json.Marshal writes s as it is between quotes: printable ASCII
// with no quote, backslash or HTML character (<, >, &, which it escapes).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

package coupon

import (
	"crypto/sha1"
	"encoding/json"
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

// Encode returns the JSON form.
func (e GrantEvent) Encode() []byte {
	b, _ := json.Marshal(e)
	return b
}

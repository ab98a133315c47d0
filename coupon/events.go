package coupon

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Event types written to the outbox.
const (
	EventGranted     = "CouponGranted"
	EventGrantFailed = "CouponGrantFailed"
)

// namespace for deterministic ids (UUIDv5): a retried or resumed grant always produces the
// same coupon id and the same event id, so a duplicate anywhere is detectable.
var namespace = uuid.MustParse("6f1c2c1e-6a4f-4a57-9a53-0c9f1d1e0b11")

// CouponID is the deterministic coupon id of (order, campaign).
func CouponID(orderID, campaignID string) string {
	return uuid.NewSHA1(namespace, []byte("coupon\x00"+campaignID+"\x00"+orderID)).String()
}

// EventID is the deterministic id of the event of type typ for (order, campaign).
func EventID(typ, orderID, campaignID string) string {
	return uuid.NewSHA1(namespace, []byte(typ+"\x00"+campaignID+"\x00"+orderID)).String()
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

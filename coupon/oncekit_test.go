package coupon_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxtest"
)

// TestGranterOncePerOrderKit runs the coupon granter through the plugin authors' test kit
// (inbox/inboxtest): duplicates, concurrent copies, poison and a rolled-back transaction
// per order and step, one delivery per transaction and under group commit (HandleBatch);
// one coupon and one CouponGranted event per order.
func TestGranterOncePerOrderKit(t *testing.T) {
	for _, grouped := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "grouped"}[grouped], func(t *testing.T) {
			d := inboxtest.DB(t, 16, couponSchema)
			cfg := campaign("kit", 1000, 1000*valueCents)
			g := setup(t, d.DB, cfg, nil)
			rep := inboxtest.Run(t, g, inboxtest.Options{
				DB:      &d,
				Grouped: grouped,
				Inbox:   inbox.Config{BizType: coupon.BizType},
				Message: func(id string) *message.Message { return message.NewMessage("", order(id).Encode()) },
				Poison: []*message.Message{
					message.NewMessage("", []byte("{not json")),
					message.NewMessage("", []byte(`{"orderId":"o-no-user","amountCents":1}`)),
				},
			})
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountQuery("SELECT COUNT(*) FROM user_coupon WHERE order_id = ?"))
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountEvents(coupon.EventGranted))
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountQuery("SELECT COUNT(*) FROM coupon_grant WHERE order_id = ? AND state = 'GRANTED'"))
			if rep.Rollbacks < len(rep.Keys) {
				t.Fatalf("only %d rollbacks injected for %d orders", rep.Rollbacks, len(rep.Keys))
			}
		})
	}
}

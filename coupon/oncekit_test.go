package coupon_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxtest"
)

// TestGranterOncePerOrderKit runs the coupon plugin's handler through inbox/inboxtest, the
// plugin authors' test kit. The kit sends duplicates, concurrent copies, poison and a
// rolled-back transaction per order. It runs one delivery per transaction and under group
// commit, with HandleBatch. Each order gets one coupon and one CouponGranted event. The
// bare Granter, which runs a step per transaction, goes through the kit one delivery per
// transaction too.
func TestGranterOncePerOrderKit(t *testing.T) {
	for _, tc := range []struct {
		name             string
		grouped, granter bool
	}{{"single", false, false}, {"grouped", true, false}, {"granter steps", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := inboxtest.DB(t, 16, couponSchema)
			cfg := campaign("kit", 1000, 1000*valueCents)
			g := setup(t, d.DB, cfg, nil)
			var h inbox.Handler = g
			if !tc.granter {
				h = plugin(t, d.DB, g)
			}
			rep := inboxtest.Run(t, h, inboxtest.Options{
				DB:      &d,
				Grouped: tc.grouped,
				Inbox:   engine.Config{BizType: coupon.BizType},
				Message: func(id string) *message.Message { return message.NewMessage("", order(id).Encode()) },
				Poison: []*message.Message{
					message.NewMessage("", []byte("{not json")),
					message.NewMessage("", []byte(`{"orderId":"o-no-user","amountCents":1}`)),
				},
			})
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountQuery(rb("SELECT COUNT(*) FROM user_coupon WHERE order_id = ?")))
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountEvents(coupon.EventGranted))
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountQuery(rb("SELECT COUNT(*) FROM coupon_grant WHERE order_id = ? AND state = 'GRANTED'")))
			if rep.Rollbacks < len(rep.Keys) {
				t.Fatalf("only %d rollbacks injected for %d orders", rep.Rollbacks, len(rep.Keys))
			}
		})
	}
}

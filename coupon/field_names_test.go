package coupon_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestFieldNamesByCaseArePoison checks that orders with a field name in another case, or a
// field given twice, are poison. They are quarantined with the reason and nothing is
// granted. The well-formed order after them is granted once. encoding/json alone would
// decode each as an order with the last orderId, or the one in capitals, and grant it.
func TestFieldNamesByCaseArePoison(t *testing.T) {
	payloads := []struct{ payload, decoded, reason string }{
		{`{"orderId":"ci-2","orderid":"ci-3","userId":"u-1","amountCents":100}`, "ci-3", `field name in another case: "orderid" at byte 18 is field "orderId"`},
		{`{"ORDERID":"ci-1","userId":"u-1","amountCents":100}`, "ci-1", `field name in another case: "ORDERID" at byte 1 is field "orderId"`},
		{`{"orderId":"ci-4","userId":"u-1","amountCents":100,"orderId":"ci-5"}`, "ci-5", `key given twice: "orderId" at byte 51`},
	}
	for _, p := range payloads {
		var o coupon.OrderPaid
		if err := json.Unmarshal([]byte(p.payload), &o); err != nil || o.OrderID != p.decoded {
			t.Fatalf("json.Unmarshal decodes %s as %+v %v, want order %s (what the decoder must not do)", p.payload, o, err, p.decoded)
		}
	}
	for _, batch := range []bool{false, true} {
		name := "one delivery per transaction"
		if batch {
			name = "group commit"
		}
		t.Run(name, func(t *testing.T) {
			d := testenv.DB(t, 4, couponSchema)
			ib, err := engine.New(d.DB, setup(t, d.DB, campaign("case", 100, 100*valueCents), nil), engine.Config{BizType: coupon.BizType}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			process := func(msg *message.Message, src inbox.Source) (engine.Result, error) {
				return ib.Process(context.Background(), msg, src, engine.ProcessOptions{})
			}
			if batch {
				b := newBatcher(t, ib, engine.BatchConfig{})
				process = func(msg *message.Message, src inbox.Source) (engine.Result, error) {
					return b.Process(context.Background(), msg, src)
				}
			}
			for i, p := range payloads {
				res, err := process(message.NewMessage(watermill.NewUUID(), []byte(p.payload)), inbox.Source{Topic: "order-paid", Partition: 1, Offset: int64(i)})
				if err != nil || res.Outcome != engine.OutcomeQuarantined || res.Reason != engine.ReasonPoison {
					t.Errorf("order %s: %+v %v, want quarantined as poison", p.payload, res, err)
				}
			}
			good := `{"orderId":"ci-6","userId":"u-1","amountCents":100}`
			res, err := process(message.NewMessage(watermill.NewUUID(), []byte(good)), inbox.Source{Topic: "order-paid", Partition: 1, Offset: int64(len(payloads))})
			if err != nil || res.Outcome != engine.OutcomeProcessed {
				t.Fatalf("order %s: %+v %v, want processed", good, res, err)
			}
			if c := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon`); c != 1 {
				t.Errorf("%d coupons, want the good order's one", c)
			}
			if c := count(t, d.DB, `SELECT COUNT(*) FROM coupon_grant WHERE order_id <> 'ci-6'`); c != 0 {
				t.Errorf("%d grants of the poison orders, want none", c)
			}
			for i, p := range payloads {
				var status, reason, lastErr string
				if err := d.DB.QueryRow(testenv.Rebind(`SELECT status, reason, last_error FROM inbox WHERE dedup_key = ?`),
					"poison:order-paid/1/"+string(rune('0'+i))).Scan(&status, &reason, &lastErr); err != nil {
					t.Fatalf("inbox row of %s: %v", p.payload, err)
				}
				if status != "failed" || reason != "poison" || !strings.Contains(lastErr, p.reason) {
					t.Errorf("inbox row of %s: %s %s %q, want failed poison saying %s", p.payload, status, reason, lastErr, p.reason)
				}
			}
		})
	}
}

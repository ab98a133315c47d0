package coupon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestInvalidUTF8OrdersArePoison checks two orders of the same user and amount whose ids
// differ only in a byte that is not UTF-8. They are two poison messages, quarantined with
// the reason and their bytes as sent, and they grant nothing. encoding/json alone would
// turn the byte into U+FFFD and decode both as one order. They would then be one inbox
// row, one coupon and one "duplicate".
func TestInvalidUTF8OrdersArePoison(t *testing.T) {
	payloads := [][]byte{
		[]byte("{\"orderId\":\"u8-\xff\",\"userId\":\"u-1\",\"amountCents\":100}"),
		[]byte("{\"orderId\":\"u8-\xfe\",\"userId\":\"u-1\",\"amountCents\":100}"),
	}
	var a, b coupon.OrderPaid
	if json.Unmarshal(payloads[0], &a) != nil || json.Unmarshal(payloads[1], &b) != nil || a.OrderID != b.OrderID || a.Fingerprint() != b.Fingerprint() {
		t.Fatalf("json.Unmarshal decodes the two orders as %+v and %+v: want one key and fingerprint (what the decoder must not do)", a, b)
	}
	for _, p := range payloads {
		if _, err := coupon.DecodeOrderPaid(p); !errors.Is(err, coupon.ErrBadOrderPaid) || !errors.Is(err, inbox.ErrNotUTF8) {
			t.Fatalf("DecodeOrderPaid(%q): %v, want ErrBadOrderPaid and ErrNotUTF8", p, err)
		}
	}
	for _, batch := range []bool{false, true} {
		name := "one delivery per transaction"
		if batch {
			name = "group commit"
		}
		t.Run(name, func(t *testing.T) {
			d := testenv.DB(t, 4, couponSchema)
			cfg := campaign("u8", 100, 100*valueCents)
			ib, err := engine.New(d.DB, setup(t, d.DB, cfg, nil), engine.Config{BizType: coupon.BizType}, nil, nil)
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
				res, err := process(message.NewMessage(watermill.NewUUID(), p), inbox.Source{Topic: "order-paid", Partition: 3, Offset: int64(i)})
				if err != nil || res.Outcome != engine.OutcomeQuarantined || res.Reason != engine.ReasonPoison {
					t.Errorf("order %q: %+v %v, want quarantined as poison", p, res, err)
				}
			}
			if c := count(t, d.DB, `SELECT (SELECT COUNT(*) FROM user_coupon) + (SELECT COUNT(*) FROM coupon_grant) + (SELECT COUNT(*) FROM outbox)`); c != 0 {
				t.Errorf("%d coupons, grants and events, want none", c)
			}
			rows, err := d.DB.Query(`SELECT dedup_key, status, reason, duplicates, payload, last_error FROM inbox ORDER BY kafka_offset`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var n int
			for ; rows.Next(); n++ {
				var key, status, reason, lastErr string
				var dups int
				var payload []byte
				if err := rows.Scan(&key, &status, &reason, &dups, &payload, &lastErr); err != nil {
					t.Fatal(err)
				}
				want := "poison:order-paid/3/" + string(rune('0'+n))
				if n >= len(payloads) || key != want || status != "failed" || reason != "poison" || dups != 0 ||
					!bytes.Equal(payload, payloads[n]) || !bytes.Contains([]byte(lastErr), []byte("payload is not valid UTF-8 at byte 15")) {
					t.Fatalf("inbox row %d: %s %s %s duplicates=%d payload=%q error=%q; want %s failed poison, the payload as sent, the byte named",
						n, key, status, reason, dups, payload, lastErr, want)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if n != len(payloads) {
				t.Fatalf("%d inbox rows, want %d", n, len(payloads))
			}
		})
	}
}

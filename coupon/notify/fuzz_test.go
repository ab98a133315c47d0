package notify_test

import (
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon/notify"
	"github.com/onceflow/onceflow/outbox"
)

// FuzzDecode checks that a coupon-granted record never panics the decoder. Its payload and
// event_type header are both outside input. Whatever the decoder accepts is UTF-8 and has
// a bounded key.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"eventId":"e","orderId":"o","userId":"u","campaignId":"c","couponId":"k","valueCents":500}`), "CouponGranted")
	f.Add([]byte(`{"eventId":"e","orderId":"o"}`), "")
	f.Add([]byte(`{}}`), "CouponGrantFailed")
	f.Add([]byte(`[1,2]`), "\x00")
	n, err := notify.New(notify.DefaultConfig(), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload []byte, eventType string) {
		m := message.NewMessage("uuid", payload)
		if eventType != "" {
			m.Metadata.Set(outbox.HeaderEventType, eventType)
		}
		d, err := n.Decode(m)
		if err != nil {
			return
		}
		if d.Key == "" || len(d.Key) > 64 || d.Fingerprint == "" || !utf8.Valid(payload) {
			t.Fatalf("accepted %q as %+v", payload, d)
		}
	})
}

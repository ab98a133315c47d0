package coupon

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/onceflow/onceflow/inbox"
)

// traffic is the plugin's input for `router produce`. It is an inbox.Sampler and an
// inbox.Poisoner.
type traffic struct{}

var (
	_ inbox.Sampler  = traffic{}
	_ inbox.Poisoner = traffic{}
)

// Sample is the seq-th order-paid event of a load run, its amount and user drawn from rng,
// paid a millisecond after the one before.
func (traffic) Sample(key string, seq int, rng *rand.Rand) []byte {
	paidAt := time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)
	o := OrderPaid{OrderID: key, UserID: fmt.Sprintf("u%d", rng.IntN(1_000_000)),
		AmountCents: int64(1000 + rng.IntN(100000)), PaidAt: paidAt.Add(time.Duration(seq) * time.Millisecond)}
	return o.Encode()
}

// Poison lists payloads DecodeOrderPaid refuses.
func (traffic) Poison(prefix string) [][]byte {
	return [][]byte{
		[]byte(`{"orderId": "` + prefix + `-bad", "userId": `), // truncated JSON
		[]byte(`{"userId": "u1", "amountCents": 100}`),         // missing orderId
		[]byte(`{"orderId": "` + prefix + `-nouser"}`),         // missing userId
		[]byte(`{"orderId": 42, "userId": "u1"}`),              // wrong type
		[]byte(`not json at all`),
	}
}

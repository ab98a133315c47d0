package coupon

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// sampleOrder is the plugin's Sample (`router produce`): the seq-th order-paid event of a
// load run, its amount and user drawn from rng, paid a millisecond after the one before.
func sampleOrder(key string, seq int, rng *rand.Rand) []byte {
	paidAt := time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)
	o := OrderPaid{OrderID: key, UserID: fmt.Sprintf("u%d", rng.IntN(1_000_000)),
		AmountCents: int64(1000 + rng.IntN(100000)), PaidAt: paidAt.Add(time.Duration(seq) * time.Millisecond)}
	return o.Encode()
}

// poisonOrders is the plugin's Poison: payloads DecodeOrderPaid refuses.
func poisonOrders(prefix string) [][]byte {
	return [][]byte{
		[]byte(`{"orderId": "` + prefix + `-bad", "userId": `), // truncated JSON
		[]byte(`{"userId": "u1", "amountCents": 100}`),         // missing orderId
		[]byte(`{"orderId": "` + prefix + `-nouser"}`),         // missing userId
		[]byte(`{"orderId": 42, "userId": "u1"}`),              // wrong type
		[]byte(`not json at all`),
	}
}

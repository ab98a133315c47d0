package points_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxtest"

	"example.com/loyalty/points"
)

// A first unit test, without a database: the handler's rows and event for one order, and a
// refused order.
func TestHandlerInMemory(t *testing.T) {
	h := points.NewHandler("points-credited")
	out := inboxtest.InMemory(t, h, message.NewMessage("m-1", []byte(`{"orderId": "o-1", "userId": "u-1", "points": 40}`)))
	if out.Err != nil || out.Key != "o-1" {
		t.Fatalf("key %q, error %v", out.Key, out.Err)
	}
	if credits := out.Table("points_credit"); len(credits) != 1 || credits[0].Value("points") != 40 {
		t.Fatalf("credits %v, want one of 40 points", credits)
	}
	events := out.EventsOfType("PointsCredited")
	if len(events) != 1 || events[0].Topic != "points-credited" || events[0].Key != "o-1" {
		t.Fatalf("events %+v, want one PointsCredited keyed o-1 on points-credited", events)
	}

	out = inboxtest.InMemory(t, h, message.NewMessage("m-2", []byte(`{"orderId": "o-2", "points": 40}`)))
	if !errors.Is(out.Err, inbox.ErrPoison) || len(out.Rows) != 0 {
		t.Fatalf("an order without user: error %v, rows %v; want poison and no row", out.Err, out.Rows)
	}
}

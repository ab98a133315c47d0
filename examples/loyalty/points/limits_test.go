package points_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxtest"
	"github.com/onceflow/onceflow/outbox"

	"example.com/loyalty/points"
)

// The longest order id the codec takes (64 bytes, the width of points_credit.order_id) is
// credited, and its event carries a valid event id, the same one its payload names; one byte
// more is poison.
func TestLongestOrderID(t *testing.T) {
	h := points.NewHandler("points-credited")
	order := func(id string) *message.Message {
		return message.NewMessage("m-"+id, []byte(`{"orderId": "`+id+`", "userId": "u-1", "points": 40}`))
	}
	long := strings.Repeat("o", 64)
	out := inboxtest.InMemory(t, h, order(long))
	if out.Err != nil || out.Key != long {
		t.Fatalf("a 64-byte order id: key %q, error %v", out.Key, out.Err)
	}
	events := out.EventsOfType("PointsCredited")
	if len(events) != 1 || events[0].ID != outbox.EventID("PointsCredited", long) || events[0].Key != long {
		t.Fatalf("events %+v, want one PointsCredited keyed by the order, its id outbox.EventID(\"PointsCredited\", order id)", events)
	}
	var ev points.PointsCredited
	if err := json.Unmarshal(events[0].Payload, &ev); err != nil || ev.EventID != events[0].ID {
		t.Fatalf("payload %s (%v): its eventId is not the event's id %s", events[0].Payload, err, events[0].ID)
	}

	out = inboxtest.InMemory(t, h, order(long+"o"))
	if !errors.Is(out.Err, inbox.ErrPoison) || len(out.Rows) != 0 || len(out.Events) != 0 {
		t.Fatalf("a 65-byte order id: error %v, rows %v, events %v; want poison and nothing written", out.Err, out.Rows, out.Events)
	}
}

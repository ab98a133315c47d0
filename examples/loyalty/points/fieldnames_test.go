package points_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxtest"

	"example.com/loyalty/points"
)

// The codec matches field names exactly: an order id in another case, or given twice, is
// poison and nothing is credited, where encoding/json alone would credit the order it took.
func TestFieldNamesExact(t *testing.T) {
	h := points.NewHandler("points-credited")
	for _, payload := range []string{
		`{"ORDERID": "o-1", "userId": "u-1", "points": 40}`,
		`{"orderId": "o-2", "orderid": "o-3", "userId": "u-1", "points": 40}`,
		`{"orderId": "o-4", "userId": "u-1", "points": 40, "orderId": "o-5"}`,
	} {
		out := inboxtest.InMemory(t, h, message.NewMessage("m", []byte(payload)))
		if !errors.Is(out.Err, inbox.ErrPoison) || len(out.Rows) != 0 || len(out.Events) != 0 {
			t.Errorf("%s: error %v, rows %v, events %v; want poison and nothing written", payload, out.Err, out.Rows, out.Events)
		}
	}
}

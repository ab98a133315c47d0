package points_test

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox/inboxtest"
	"github.com/onceflow/onceflow/migrations"

	"example.com/loyalty/points"
)

func shipped(order string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"orderId": %q, "userId": "u-%s", "points": 40}`, order, order)))
}

// The plugin through the test kit: duplicates, concurrent copies, rolled-back commits and
// poison, one delivery per transaction and under group commit: one credit and one
// PointsCredited event per order, none for the refused messages.
func TestCreditOncePerOrder(t *testing.T) {
	for _, grouped := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "grouped"}[grouped], func(t *testing.T) {
			d := inboxtest.DB(t, 8, migrations.Set{Name: points.Name, FS: points.Migrations})
			rep := inboxtest.Run(t, points.NewHandler("points-credited"), inboxtest.Options{
				DB: &d, Grouped: grouped, Message: shipped,
				Poison: []*message.Message{
					message.NewMessage("bad-json", []byte(`{"orderId": "o-1"`)),
					message.NewMessage("no-user", []byte(`{"orderId": "o-2", "points": 5}`)),
					message.NewMessage("no-points", []byte(`{"orderId": "o-3", "userId": "u"}`)),
					message.NewMessage("trailing", []byte(`{"orderId": "o-4", "userId": "u", "points": 1} {}`)),
				},
			})
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountQuery("SELECT COUNT(*) FROM points_credit WHERE order_id = ?"))
			inboxtest.AssertOncePerKey(t, rep, inboxtest.CountEvents("PointsCredited"))
			var balance int
			if err := d.DB.QueryRow("SELECT COALESCE(SUM(points), 0) FROM points_balance").Scan(&balance); err != nil {
				t.Fatal(err)
			}
			if want := 40 * len(rep.Keys); balance != want {
				t.Fatalf("balances sum to %d, want %d (40 per order)", balance, want)
			}
		})
	}
}

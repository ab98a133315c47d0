package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

// OrderShipped is the payload of order-shipped.
type OrderShipped struct {
	OrderID string `json:"orderId"`
	UserID  string `json:"userId"`
	Points  int64  `json:"points"`
}

// ExampleTyped shows a typed handler. The JSON codec decodes each message into an
// OrderShipped. It allows unknown fields and refuses trailing data. The plugin names its
// business key, and Handle receives the decoded value. In a router, Handle runs with the
// inbox's transaction.
func ExampleTyped() {
	credit := inbox.Typed(
		inbox.JSON[OrderShipped]{
			Key: func(o OrderShipped) (string, error) {
				if o.OrderID == "" || o.UserID == "" {
					return "", errors.New("orderId and userId are required") // poison
				}
				return o.OrderID, nil // credited once per order
			},
		},
		func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderShipped) (inbox.Progress, error) {
			// In the inbox's transaction, tx.ExecContext(ctx, "INSERT INTO points_credit ...", o.OrderID, ...)
			// writes the credit, and an outbox.Writer adds the points-credited event with the same tx.
			fmt.Printf("credit %d points to %s for %s\n", o.Points, o.UserID, o.OrderID)
			return inbox.Done, nil
		})

	d, err := credit.Decode(message.NewMessage("m-1", []byte(`{"orderId":"o-1","userId":"u-7","points":12,"carrier":"dhl"}`)))
	fmt.Println(d.Key, err)
	progress, err := credit.Handle(context.Background(), nil, &inbox.Delivery{Key: d.Key, Value: d.Value})
	fmt.Println(progress, err)

	_, err = credit.Decode(message.NewMessage("m-2", []byte(`{"orderId":"o-2","userId":"u-8"} {"orderId":"o-3"}`)))
	fmt.Println(err)
	_, err = credit.Decode(message.NewMessage("m-3", []byte(`{"orderId":"o-4"}`)))
	fmt.Println(err)
	// Output:
	// o-1 <nil>
	// credit 12 points to u-7 for o-1
	// done <nil>
	// poison message: json: data after the value, which ends at byte 32
	// poison message: orderId and userId are required
}

// ExampleInserter shows a plain handler's rows written through Inserters. They are written
// at once when a delivery runs alone, or at the end of a group-committed batch in
// multi-row INSERTs. The handler never reads them back in the same transaction, because in
// a batch they are not written yet.
func ExampleInserter() {
	credits, err := inbox.NewInserter("points_credit", "order_id", "user_id", "points")
	if err != nil {
		panic(err)
	}
	balances, err := inbox.NewInserter("points_balance", "user_id", "points")
	if err != nil {
		panic(err)
	}
	balances.OnDuplicateKeyUpdate("points = points + VALUES(points)")                        // add to the user's balance
	balances.OnConflictUpdate("user_id", "points = points_balance.points + EXCLUDED.points") // the same on PostgreSQL
	_ = inbox.Typed(
		inbox.JSON[OrderShipped]{Key: func(o OrderShipped) (string, error) { return o.OrderID, nil }},
		func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderShipped) (inbox.Progress, error) {
			if err := credits.Insert(ctx, tx, o.OrderID, o.UserID, o.Points); err != nil {
				return 0, err
			}
			return inbox.Done, balances.Insert(ctx, tx, o.UserID, o.Points)
		})
	// A value missing is the handler's bug. It is refused before any round trip, and is
	// permanent.
	fmt.Println(credits.Insert(context.Background(), nil, "o-1", "u-1"))
	// Output:
	// insert into points_credit: 2 values for 3 columns (order_id, user_id, points)
}

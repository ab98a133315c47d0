// Package points is a loyalty-points plugin, written as a team outside onceflow would: it
// credits each shipped order's points once and emits PointsCredited through the outbox.
package points

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/outbox"
)

// OrderShipped is the order-shipped event: {"orderId": "...", "userId": "...", "points": 40}.
type OrderShipped struct {
	OrderID string `json:"orderId"`
	UserID  string `json:"userId"`
	Points  int    `json:"points"`
}

// PointsCredited is the event the plugin emits once per credited order.
type PointsCredited struct {
	EventID string `json:"eventId"`
	OrderID string `json:"orderId"`
	UserID  string `json:"userId"`
	Points  int    `json:"points"`
}

// Config is the plugin's settings, plugins.loyalty-points.<key> in the router's
// configuration (or ONCEFLOW_PLUGINS_LOYALTY_POINTS_<KEY>): each one's key, default, range
// and help are its tags, as the router's own settings are declared.
type Config struct {
	CreditedTopic string `key:"credited_topic" default:"points-credited" help:"topic of the PointsCredited events"`
}

//go:embed migrations/*.sql migrations/grants.txt migrations/postgres/*.sql migrations/postgres/grants.txt
var files embed.FS

// Migrations are the plugin's tables, applied by `router migrate`.
var Migrations, _ = fs.Sub(files, "migrations")

// Name is the plugin's name: its configuration section and its migrations' version table.
const Name = "loyalty-points"

// codec decodes order-shipped: the order id is the business key; an order without user or
// with points outside 1..100000 is poison.
var codec = inbox.JSON[OrderShipped]{
	Key: func(o OrderShipped) (string, error) {
		switch {
		case o.OrderID == "" || len(o.OrderID) > 64:
			return "", errors.New("orderId missing or longer than 64 bytes")
		case o.UserID == "" || len(o.UserID) > 64:
			return "", errors.New("userId missing or longer than 64 bytes")
		case o.Points < 1 || o.Points > 100000:
			return "", fmt.Errorf("points %d outside 1..100000", o.Points)
		}
		return o.OrderID, nil
	},
	Fingerprint: func(o OrderShipped) string { return fmt.Sprintf("%s\x00%s\x00%d", o.OrderID, o.UserID, o.Points) },
}

// NewHandler returns the plugin's handler, emitting its events to topic.
func NewHandler(topic string) inbox.Handler {
	w, err1 := outbox.NewWriter("outbox")
	credits, err2 := inbox.NewInserter("points_credit", "order_id", "user_id", "points")
	balances, err3 := inbox.NewInserter("points_balance", "user_id", "points")
	if err := errors.Join(err1, err2, err3); err != nil {
		panic(err) // the names above are valid
	}
	balances.OnDuplicateKeyUpdate("points = points + VALUES(points)").
		OnConflictUpdate("user_id", "points = points_balance.points + EXCLUDED.points") // on PostgreSQL
	return inbox.Typed(codec, func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderShipped) (inbox.Progress, error) {
		if err := credits.Insert(ctx, tx, o.OrderID, o.UserID, o.Points); err != nil {
			return 0, err
		}
		if err := balances.Insert(ctx, tx, o.UserID, o.Points); err != nil {
			return 0, err
		}
		// The event id is 36 bytes at most: a stable id made of the event's type and the
		// order id (up to 64 bytes), the same whenever this order's event is written again.
		ev := PointsCredited{EventID: outbox.EventID("PointsCredited", o.OrderID), OrderID: o.OrderID, UserID: o.UserID, Points: o.Points}
		payload, err := json.Marshal(ev)
		if err != nil {
			return 0, err
		}
		return inbox.Done, w.Add(ctx, tx, outbox.Event{ID: ev.EventID, Type: "PointsCredited", Topic: topic, Key: o.OrderID, Payload: payload})
	})
}

// Plugin is the plugin's declaration.
func Plugin() inbox.Plugin {
	return inbox.Plugin{
		Name: Name, Topics: []string{"order-shipped"}, ConsumerGroup: "loyalty-points", BizType: "loyalty", KeyLogField: "order_id",
		Migrations: Migrations,
		Tables:     []string{"points_credit", "points_balance"},
		// The runtime decodes and checks plugins.loyalty-points before anything connects,
		// and hands Writes and Build a Config.
		Settings: Config{},
		Writes: func(s any) ([]string, error) {
			return []string{s.(Config).CreditedTopic}, nil
		},
		Build: func(ctx context.Context, env inbox.PluginEnv) (inbox.Handler, error) {
			return NewHandler(env.Settings.(Config).CreditedTopic), nil
		},
	}
}

func init() { inbox.MustRegister(Plugin()) }

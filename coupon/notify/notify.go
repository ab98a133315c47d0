// Package notify is the coupon notifier plugin. It consumes coupon-granted through its own
// inbox, with biz type "notify" and consumer group "coupon-notifier". It records one
// notification per granted coupon. It shows biz-type isolation and a chain of plugins. The
// same order id is in the inbox once as "coupon" and once as "notify". Each row is
// processed once, and neither blocks the other.
//
// The router binary blank-imports the package, and its init function registers the
// plugin.
package notify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/jsonkeys"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// PluginName, BizType, ConsumerGroup and Topic identify the plugin, and Table is its
// table.
const (
	PluginName    = "coupon-notifier"
	BizType       = "notify"
	ConsumerGroup = "coupon-notifier"
	Topic         = "coupon-granted"
	// Table holds the notifications. Migrations creates it.
	Table = "notification"
)

// Config is the notifier's settings. In the router's configuration they are
// plugins.coupon-notifier.<key>, because the plugin declares Config as its Settings.
type Config struct {
	// Channel names where notifications go. It is part of the notification's unique key.
	Channel string `key:"channel" default:"wallet" help:"where the notifications go (1..32 bytes); part of a notification's unique key, with the order id"`
}

// DefaultConfig returns every setting at its default. Notifications then go through the
// in-app wallet channel.
func DefaultConfig() Config {
	var c Config
	settings.SetDefaults(&c)
	return c
}

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	if c.Channel == "" || len(c.Channel) > 32 {
		return fmt.Errorf("notify: channel %q must be 1..32 bytes", c.Channel)
	}
	return nil
}

// Notifier is the inbox handler.
type Notifier struct {
	cfg    Config
	logger watermill.LoggerAdapter
	insert atomic.Pointer[string] // the database's insert, which insertOf asks of the server once
}

// insertNotification is the notification's insert. mysqlInsert and pgInsert make it an
// upsert, so a second notification of an order and channel changes nothing.
const (
	insertNotification = `INSERT INTO ` + Table + ` (order_id, channel, user_id, coupon_id, campaign_id, value_cents, event_id, message)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	mysqlInsert = insertNotification + ` ON DUPLICATE KEY UPDATE id = id`
)

var pgInsert = dbx.Postgres.Rebind(insertNotification + ` ON CONFLICT (order_id, channel) DO NOTHING`)

// insertOf is the insert for the database tx belongs to, PostgreSQL's or the MySQL
// family's. It tells them apart by the server's version, once.
func (n *Notifier) insertOf(ctx context.Context, tx *sql.Tx) (string, error) {
	if q := n.insert.Load(); q != nil {
		return *q, nil
	}
	var v string
	if err := tx.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return "", fmt.Errorf("notify: database version: %w", err)
	}
	q := mysqlInsert
	if strings.HasPrefix(v, "PostgreSQL") {
		q = pgInsert
	}
	n.insert.Store(&q)
	return q, nil
}

var _ inbox.Handler = (*Notifier)(nil)

// New builds a Notifier.
func New(cfg Config, logger watermill.LoggerAdapter) (*Notifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Notifier{cfg: cfg, logger: logger}, nil
}

// DecodeGrant parses a coupon-granted payload. Unknown fields are allowed. DecodeGrant
// refuses bad JSON, bytes that are not UTF-8, trailing data and wrong types. It refuses a
// field name in another case and a key given twice. It refuses a missing eventId, orderId,
// userId, campaignId or couponId, and a valueCents that is not positive.
func DecodeGrant(b []byte) (coupon.GrantEvent, error) {
	var e coupon.GrantEvent
	if err := inbox.CheckJSONText(b); err != nil {
		return e, fmt.Errorf("coupon-granted: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&e); err != nil {
		return e, fmt.Errorf("coupon-granted: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return e, errors.New("coupon-granted: trailing data after the JSON object")
	}
	if err := jsonkeys.Check(b, reflect.TypeOf(e)); err != nil {
		return e, fmt.Errorf("coupon-granted: %w", err)
	}
	for name, v := range map[string]string{"eventId": e.EventID, "orderId": e.OrderID, "userId": e.UserID, "campaignId": e.CampaignID, "couponId": e.CouponID} {
		if v == "" {
			return e, fmt.Errorf("coupon-granted: missing %s", name)
		}
		if len(v) > coupon.MaxIDLen {
			return e, fmt.Errorf("coupon-granted: %s longer than %d bytes", name, coupon.MaxIDLen)
		}
	}
	if e.ValueCents <= 0 {
		return e, fmt.Errorf("coupon-granted: valueCents %d is not positive", e.ValueCents)
	}
	return e, nil
}

// Decode implements inbox.Handler. The dedup key is the order id.
func (n *Notifier) Decode(msg *message.Message) (inbox.Decoded, error) {
	if t := msg.Metadata.Get(outbox.HeaderEventType); t != "" && t != coupon.EventGranted {
		return inbox.Decoded{}, inbox.PoisonError("event type %q on the coupon-granted topic, want %s", t, coupon.EventGranted)
	}
	e, err := DecodeGrant(msg.Payload)
	if err != nil {
		return inbox.Decoded{}, inbox.PoisonError("%v", err)
	}
	// The fingerprint is the meaning of a grant. A re-published event with the same event id
	// is the same grant, even if the relay sent it twice.
	fp := sha256.Sum256([]byte(e.EventID + "\x00" + e.OrderID + "\x00" + e.UserID + "\x00" + e.CampaignID + "\x00" + e.CouponID + "\x00" + strconv.FormatInt(e.ValueCents, 10)))
	return inbox.Decoded{Key: e.OrderID, Fingerprint: hex.EncodeToString(fp[:]), Value: e}, nil
}

// Handle implements inbox.Handler. It records the notification in tx.
func (n *Notifier) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	e, ok := d.Value.(coupon.GrantEvent)
	if !ok {
		return inbox.Done, inbox.Permanent(fmt.Errorf("notify: unexpected value %T", d.Value))
	}
	text := fmt.Sprintf("You received a coupon worth %d.%02d (campaign %s)", e.ValueCents/100, e.ValueCents%100, e.CampaignID)
	// The unique key on order_id and channel is the second line of defence. If the inbox
	// row were cleaned and the event replayed from Kafka, the user would still be notified
	// once.
	q, err := n.insertOf(ctx, tx)
	if err != nil {
		return inbox.Done, err
	}
	r, err := tx.ExecContext(ctx, q,
		e.OrderID, n.cfg.Channel, e.UserID, e.CouponID, e.CampaignID, e.ValueCents, e.EventID, text)
	if err != nil {
		return inbox.Done, fmt.Errorf("notify %s: %w", e.OrderID, err)
	}
	if k, err := r.RowsAffected(); err == nil && k == 0 {
		n.logger.Info("notification already recorded", watermill.LogFields{"order_id": e.OrderID, "channel": n.cfg.Channel})
	}
	return inbox.Done, nil
}

// Plugin returns the notifier's plugin declaration.
func Plugin() inbox.Plugin {
	return inbox.Plugin{
		Name:          PluginName,
		Topics:        []string{Topic},
		ConsumerGroup: ConsumerGroup,
		BizType:       BizType,
		KeyLogField:   "order_id",
		Migrations:    Migrations,
		Tables:        []string{Table}, // checked by the runtime at start
		Settings:      Config{},        // plugins.coupon-notifier.channel
		Build: func(_ context.Context, env inbox.PluginEnv) (inbox.Handler, error) {
			cfg, ok := env.Settings.(Config)
			if !ok {
				return nil, fmt.Errorf("notify: settings of type %T, want a notify.Config", env.Settings)
			}
			return New(cfg, env.Logger)
		},
	}
}

func init() { inbox.MustRegister(Plugin()) }

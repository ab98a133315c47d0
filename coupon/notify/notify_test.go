package notify_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/coupon/notify"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func grantEvent(orderID string) coupon.GrantEvent {
	return coupon.GrantEvent{EventID: coupon.EventID(coupon.EventGranted, orderID, "c1"), OrderID: orderID, UserID: "u1",
		CampaignID: "c1", CouponID: coupon.CouponID(orderID, "c1"), ValueCents: 500, GrantedAt: time.Date(2026, 11, 11, 0, 0, 1, 0, time.UTC)}
}

func TestDecode(t *testing.T) {
	n, err := notify.New(notify.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	good := grantEvent("o-1")
	d, err := n.Decode(message.NewMessage("m", good.Encode()))
	if err != nil || d.Key != "o-1" || d.Fingerprint == "" {
		t.Fatalf("good event: %+v %v", d, err)
	}
	republished := message.NewMessage("m2", good.Encode())
	republished.Metadata.Set(outbox.HeaderEventType, coupon.EventGranted)
	if d2, err := n.Decode(republished); err != nil || d2.Fingerprint != d.Fingerprint {
		t.Fatalf("the same event again must have the same fingerprint: %+v %v", d2, err)
	}
	failedEvt := message.NewMessage("m3", good.Encode())
	failedEvt.Metadata.Set(outbox.HeaderEventType, coupon.EventGrantFailed)
	poison := []struct {
		name string
		msg  *message.Message
		want string
	}{
		{"not json", message.NewMessage("p", []byte("hello")), "coupon-granted"},
		{"trailing data", message.NewMessage("p", append(good.Encode(), '}')), "trailing"},
		{"missing orderId", message.NewMessage("p", []byte(`{"eventId":"e","userId":"u","campaignId":"c","couponId":"x","valueCents":5}`)), "orderId"},
		{"missing couponId", message.NewMessage("p", []byte(`{"eventId":"e","orderId":"o","userId":"u","campaignId":"c","valueCents":5}`)), "couponId"},
		{"wrong type", message.NewMessage("p", []byte(`{"eventId":"e","orderId":7,"userId":"u","campaignId":"c","couponId":"x","valueCents":5}`)), "orderId"},
		{"zero value", message.NewMessage("p", []byte(`{"eventId":"e","orderId":"o","userId":"u","campaignId":"c","couponId":"x","valueCents":0}`)), "valueCents"},
		{"bad grantedAt", message.NewMessage("p", []byte(`{"eventId":"e","orderId":"o","userId":"u","campaignId":"c","couponId":"x","valueCents":5,"grantedAt":"soon"}`)), "soon"},
		{"failed event on the topic", failedEvt, coupon.EventGrantFailed},
		{"orderId not UTF-8", message.NewMessage("p", []byte("{\"eventId\":\"e\",\"orderId\":\"o\xff\",\"userId\":\"u\",\"campaignId\":\"c\",\"couponId\":\"x\",\"valueCents\":5}")), "payload is not valid UTF-8 at byte 27"},
		{"orderId with a lone surrogate", message.NewMessage("p", []byte(`{"eventId":"e","orderId":"o\udbff","userId":"u","campaignId":"c","couponId":"x","valueCents":5}`)), "payload is not valid UTF-8 at byte 27"},
		{"orderId in another case", message.NewMessage("p", []byte(`{"eventId":"e","ORDERID":"o","userId":"u","campaignId":"c","couponId":"x","valueCents":5}`)),
			`field name in another case: "ORDERID" at byte 15 is field "orderId"`},
		{"orderId, then in another case", message.NewMessage("p", []byte(`{"eventId":"e","orderId":"o-1","orderid":"o-2","userId":"u","campaignId":"c","couponId":"x","valueCents":5}`)),
			`field name in another case: "orderid"`},
		{"orderId given twice", message.NewMessage("p", []byte(`{"eventId":"e","orderId":"o-1","orderId":"o-2","userId":"u","campaignId":"c","couponId":"x","valueCents":5}`)),
			`key given twice: "orderId" at byte 31`},
	}
	for _, tc := range poison {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.Decode(tc.msg)
			if !errors.Is(err, inbox.ErrPoison) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want poison mentioning %q", err, tc.want)
			}
		})
	}
}

func TestRegistered(t *testing.T) {
	var p inbox.Plugin
	ok := false
	for _, r := range inbox.RegisteredPlugins() {
		if r.Name == notify.PluginName {
			p, ok = r, true
		}
	}
	if !ok || p.BizType != "notify" || p.ConsumerGroup != "coupon-notifier" || len(p.Topics) != 1 || p.Topics[0] != "coupon-granted" {
		t.Fatalf("plugin: %+v %v", p, ok)
	}
	if _, err := notify.New(notify.Config{}, nil); err == nil {
		t.Fatal("empty channel accepted")
	}
}

func count(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(testenv.Dialect().Rebind(q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestTwoBizTypesSameOrderEachProcessOnce checks the chain and biz-type isolation on one
// database. The coupon inbox grants, and the notifier consumes the CouponGranted event it
// wrote, through its own inbox. The same order id is in the inbox once per biz type, and
// each row is processed once. A quarantined notification does not block the coupon, and a
// notify row does not block the coupon of the same order id.
func TestTwoBizTypesSameOrderEachProcessOnce(t *testing.T) {
	d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations},
		migrations.Set{Name: notify.PluginName, FS: notify.Migrations})
	db := d.DB
	ctx := context.Background()
	cc := coupon.DefaultConfig()
	if err := coupon.EnsureCampaign(ctx, db, cc); err != nil {
		t.Fatal(err)
	}
	granter, err := coupon.NewGranter(cc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fast := func(biz string) engine.Config {
		return engine.Config{BizType: biz, MaxAttempts: 2, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond, DelayedRetries: -1} // quarantined at once
	}
	coupons, err := engine.New(db, granter, fast(coupon.BizType), watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := notify.New(notify.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	notifier, err := engine.New(db, breakable{n, &broken}, fast(notify.BizType), watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	orderMsg := func(id string) *message.Message {
		o := coupon.OrderPaid{OrderID: id, UserID: "u1", AmountCents: 1000, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
		return message.NewMessage(watermill.NewUUID(), o.Encode())
	}
	// grantedMsg is what the relay publishes for the order, the outbox row's payload and
	// headers.
	grantedMsg := func(id string) *message.Message {
		var payload []byte
		if err := db.QueryRow(testenv.Dialect().Rebind("SELECT payload FROM outbox WHERE msg_key = ? AND event_type = ?"), id, coupon.EventGranted).Scan(&payload); err != nil {
			t.Fatalf("grant event of %s: %v", id, err)
		}
		m := message.NewMessage(watermill.NewUUID(), payload)
		m.Metadata.Set(outbox.HeaderEventType, coupon.EventGranted)
		return m
	}
	process := func(ib *engine.Inbox, m *message.Message, want engine.Outcome) {
		t.Helper()
		r, err := ib.Process(ctx, m, inbox.Source{Topic: "t"}, engine.ProcessOptions{})
		if err != nil || r.Outcome != want {
			t.Fatalf("%s: %+v %v, want %s", ib.BizType(), r, err, want)
		}
	}

	// The chain, with duplicates on both hops.
	process(coupons, orderMsg("o-1"), engine.OutcomeProcessed)
	process(coupons, orderMsg("o-1"), engine.OutcomeDuplicate)
	process(notifier, grantedMsg("o-1"), engine.OutcomeProcessed)
	process(notifier, grantedMsg("o-1"), engine.OutcomeDuplicate)
	if got := count(t, db, "SELECT COUNT(*) FROM inbox WHERE dedup_key = 'o-1' AND status = 'done' AND biz_type IN ('coupon', 'notify')"); got != 2 {
		t.Fatalf("inbox rows of o-1 = %d, want one done row per biz type", got)
	}
	if got := count(t, db, "SELECT COUNT(*) FROM notification WHERE order_id = 'o-1' AND coupon_id = ?", coupon.CouponID("o-1", cc.CampaignID)); got != 1 {
		t.Fatalf("notifications of o-1 = %d, want 1", got)
	}

	// A notify row first does not block the coupon of the same order id.
	process(notifier, message.NewMessage(watermill.NewUUID(), grantEvent("o-2").Encode()), engine.OutcomeProcessed)
	process(coupons, orderMsg("o-2"), engine.OutcomeProcessed)
	if got := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-2'"); got != 1 {
		t.Fatalf("coupons of o-2 = %d, want 1", got)
	}

	// A quarantined notification blocks neither the coupon of its order nor other orders,
	// and is replayed once fixed.
	process(coupons, orderMsg("o-3"), engine.OutcomeProcessed)
	broken.Store(true)
	process(notifier, grantedMsg("o-3"), engine.OutcomeQuarantined)
	process(coupons, orderMsg("o-3"), engine.OutcomeDuplicate)
	process(coupons, orderMsg("o-4"), engine.OutcomeProcessed)
	broken.Store(false)
	process(notifier, grantedMsg("o-4"), engine.OutcomeProcessed)
	rep, err := inboxops.Replay(ctx, notifier, inboxops.ReplayOptions{Filter: inboxops.Filter{Statuses: []engine.Status{engine.StatusFailed}}})
	if err != nil || rep.Selected != 1 || rep.Processed != 1 {
		t.Fatalf("notify replay: %+v %v", rep, err)
	}
	if got := count(t, db, "SELECT COUNT(*) FROM notification"); got != 4 {
		t.Fatalf("notifications = %d, want 4 (o-1..o-4)", got)
	}
	if got := count(t, db, "SELECT COUNT(*) FROM inbox WHERE biz_type = 'coupon' AND status = 'done'"); got != 4 {
		t.Fatalf("coupon rows done = %d, want 4", got)
	}
	// The coupon invariants are per biz type coupon and still hold.
	audit, err := coupon.Verify(ctx, db, cc.CampaignID, time.Hour)
	if err != nil || !audit.OK() || audit.Granted != 4 || audit.InboxDone != 4 {
		t.Fatalf("coupon audit: %+v %v", audit, err)
	}
}

// breakable fails every Handle while broken is set.
type breakable struct {
	inbox.Handler
	broken *atomic.Bool
}

func (b breakable) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if b.broken.Load() {
		return inbox.Done, errors.New("push gateway down")
	}
	return b.Handler.Handle(ctx, tx, d)
}

// TestOrderIDsCompareExactly checks that order ids compare exactly. Grants of "o-9" and
// "o-9 " are two notifications. A PAD SPACE collation would take the second for the
// first's duplicate. The notifier's migration 00002 and the framework's 00013 set NO PAD
// collations.
func TestOrderIDsCompareExactly(t *testing.T) {
	d := testenv.DB(t, 4, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations},
		migrations.Set{Name: notify.PluginName, FS: notify.Migrations})
	n, err := notify.New(notify.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := engine.New(d.DB, n, engine.Config{BizType: notify.BizType, MaxAttempts: 1, DelayedRetries: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"o-9", "o-9 ", "O-9"} {
		r, err := ib.Process(context.Background(), message.NewMessage(watermill.NewUUID(), grantEvent(id).Encode()), inbox.Source{Topic: "t"}, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeProcessed {
			t.Errorf("grant of %q: %+v %v, want processed", id, r, err)
		}
	}
	if got := count(t, d.DB, "SELECT COUNT(*) FROM notification"); got != 3 {
		t.Fatalf("notifications: %d, want 3", got)
	}
}

// TestNotificationOncePerOrderAndChannel checks the notification's unique key, the second
// line of defence. A grant may be handled again without its inbox row, when the row was
// cleaned and the event replayed from Kafka. It then records nothing more, and its
// transaction goes on. On PostgreSQL a failed duplicate insert would abort it. Another
// channel is another notification.
func TestNotificationOncePerOrderAndChannel(t *testing.T) {
	d := testenv.DB(t, 2, migrations.Set{Name: notify.PluginName, FS: notify.Migrations})
	ctx := context.Background()
	wallet, err := notify.New(notify.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sms, err := notify.New(notify.Config{Channel: "sms"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := grantEvent("o-twice")
	for i, n := range []*notify.Notifier{wallet, wallet, sms} {
		err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
			if p, err := n.Handle(ctx, tx, &inbox.Delivery{BizType: notify.BizType, Key: e.OrderID, Value: e}); err != nil || p != inbox.Done {
				return fmt.Errorf("handle: %v %w", p, err)
			}
			_, err := tx.ExecContext(ctx, "SELECT COUNT(*) FROM "+notify.Table)
			return err
		})
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if got := count(t, d.DB, "SELECT COUNT(*) FROM notification WHERE order_id = ?", e.OrderID); got != 2 {
		t.Fatalf("notifications: %d, want 2 (wallet and sms)", got)
	}
}

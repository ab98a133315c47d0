package inboxops_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
)

// couponSchema is the coupon plugin's migrations, because the replays run the coupon
// granter.
var couponSchema = migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations}

var src = inbox.Source{Topic: "order-paid", Partition: 3, Offset: 10233}

// pipeline is an inbox running the coupon granter, a step per transaction, on a fresh
// database.
type pipeline struct {
	db    testenv.Database
	inbox *engine.Inbox
}

type pipelineOpts struct {
	conns    int
	wrap     func(inbox.Handler) inbox.Handler
	inboxCfg engine.Config
}

func newPipeline(t testing.TB, o pipelineOpts) *pipeline {
	t.Helper()
	d := testenv.DB(t, max(o.conns, 4), couponSchema)
	cfg := coupon.DefaultConfig()
	if err := coupon.EnsureCampaign(context.Background(), d.DB, cfg); err != nil {
		t.Fatal(err)
	}
	g, err := coupon.NewGranter(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var h inbox.Handler = g
	if o.wrap != nil {
		h = o.wrap(h)
	}
	ic := o.inboxCfg
	ic.BizType = coupon.BizType
	if ic.DelayedRetries == 0 { // failures end quarantined at once: what a replay runs again
		ic.DelayedRetries = -1
	}
	if ic.BackoffInitial == 0 {
		ic.BackoffInitial, ic.BackoffMax = time.Millisecond, 10*time.Millisecond
	}
	ib, err := engine.New(d.DB, h, ic, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeline{db: d, inbox: ib}
}

func orderMsg(orderID, userID string) *message.Message {
	o := coupon.OrderPaid{OrderID: orderID, UserID: userID, AmountCents: 12345, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
	return message.NewMessage(watermill.NewUUID(), o.Encode())
}

func count(t testing.TB, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(testenv.Rebind(q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// handlerFunc replaces a handler's Handle.
type handlerFunc struct {
	inner  inbox.Handler
	handle func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error)
}

func (h handlerFunc) Decode(m *message.Message) (inbox.Decoded, error) { return h.inner.Decode(m) }
func (h handlerFunc) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	return h.handle(ctx, tx, d)
}

// explainPlan runs EXPLAIN on a single-table query and returns its access type, key and
// Extra column.
func explainPlan(t *testing.T, db *sql.DB, query string, args ...any) (typ, key, extra string) {
	t.Helper()
	var id, selType, table, ty, possible, k, keyLen, ref, rows, ex sql.NullString
	if err := db.QueryRow("EXPLAIN "+query, args...).Scan(&id, &selType, &table, &ty, &possible, &k, &keyLen, &ref, &rows, &ex); err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	return ty.String, k.String, ex.String
}

package engine_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
)

// couponSchema is the coupon plugin's migrations, applied by testenv.DB after the
// framework's. The inbox is tested with the coupon granter as its handler.
var couponSchema = migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations}

// pipeline is the inbox + coupon granter on a fresh database.
type pipeline struct {
	db      testenv.Database
	granter *coupon.Granter
	inbox   *engine.Inbox
	cfg     coupon.Config
}

type pipelineOpts struct {
	conns        int
	shared       *testenv.Database // reuse this database (several consumers of one DB)
	svc          coupon.ExternalService
	plugin       bool // the plugin's handler (Granter.Handler), not the bare granter (a step per Handle)
	wrap         func(inbox.Handler) inbox.Handler
	inboxCfg     engine.Config
	couponCfg    func(*coupon.Config)
	grantedTopic string
	outage       bool // inboxCfg's delayed redelivery and circuit breaker as they are (else off)
}

func newPipeline(t testing.TB, o pipelineOpts) *pipeline {
	t.Helper()
	var d testenv.Database
	if o.shared != nil {
		d = *o.shared
	} else {
		d = testenv.DB(t, o.conns, couponSchema)
	}
	cfg := coupon.DefaultConfig()
	if o.grantedTopic != "" {
		cfg.GrantedTopic = o.grantedTopic
	}
	if o.couponCfg != nil {
		o.couponCfg(&cfg)
	}
	if err := coupon.EnsureCampaign(context.Background(), d.DB, cfg); err != nil {
		t.Fatal(err)
	}
	g, err := coupon.NewGranter(cfg, o.svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	var h inbox.Handler = g
	if o.plugin {
		ph, err := g.Handler(d.DB)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ph.(io.Closer).Close() })
		h = ph
	}
	if o.wrap != nil {
		h = o.wrap(h)
	}
	ic := o.inboxCfg
	ic.BizType = coupon.BizType
	if !o.outage {
		// In tests of the attempts and the quarantine, a failure ends quarantined at once.
		ic.DelayedRetries, ic.BreakerOff = -1, true
	}
	if ic.BackoffInitial == 0 {
		ic.BackoffInitial = time.Millisecond
		ic.BackoffMax = 10 * time.Millisecond
	}
	ib, err := engine.New(d.DB, h, ic, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeline{db: d, granter: g, inbox: ib, cfg: cfg}
}

func orderMsg(orderID, userID string) *message.Message {
	o := coupon.OrderPaid{OrderID: orderID, UserID: userID, AmountCents: 12345, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
	return message.NewMessage(watermill.NewUUID(), o.Encode())
}

func count(t testing.TB, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	err := db.QueryRow(testenv.Rebind(q), args...).Scan(&n)
	for try := 0; errors.Is(err, driver.ErrBadConn) && try < 3; try++ {
		// The server may close a pooled connection under load, after database/sql's own
		// retries are used up. A polled count then asks again rather than failing the test.
		time.Sleep(100 * time.Millisecond)
		err = db.QueryRow(testenv.Rebind(q), args...).Scan(&n)
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// failUntilFixed wraps the granter. Every step fails while broken is set, as during an
// outage of the downstream. So the message is quarantined after MaxAttempts.
func failUntilFixed(broken *atomic.Bool) func(inbox.Handler) inbox.Handler {
	return func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if broken.Load() {
				return inbox.Continue, errors.New("wallet service down")
			}
			return g.Handle(ctx, tx, d)
		}}
	}
}

func failedFilter() inboxops.Filter {
	return inboxops.Filter{Statuses: []engine.Status{engine.StatusFailed}}
}

// handlerFunc adapts functions to inbox.Handler for tests that wrap the granter.
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
//
// On PostgreSQL it reads EXPLAIN's text in the same terms. An index scan gives type
// "range" and its index, and anything else type "ALL". extra is "filesort" when the plan
// sorts.
func explainPlan(t *testing.T, db *sql.DB, query string, args ...any) (typ, key, extra string) {
	t.Helper()
	if testenv.Dialect().IsPostgres() {
		return pgExplainPlan(t, db, query, args...)
	}
	var id, selType, table, ty, possible, k, keyLen, ref, rows, ex sql.NullString
	if err := db.QueryRow("EXPLAIN "+query, args...).Scan(&id, &selType, &table, &ty, &possible, &k, &keyLen, &ref, &rows, &ex); err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	return ty.String, k.String, ex.String
}

func pgExplainPlan(t *testing.T, db *sql.DB, query string, args ...any) (typ, key, extra string) {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+testenv.Rebind(query), args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	defer rows.Close()
	typ = "ALL"
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		if _, rest, ok := strings.Cut(line, "Index Scan using "); ok && key == "" {
			key, _, _ = strings.Cut(rest, " ")
			typ = "range"
		}
		if _, rest, ok := strings.Cut(line, "Index Only Scan using "); ok && key == "" {
			key, _, _ = strings.Cut(rest, " ")
			typ = "range"
		}
		if strings.Contains(line, "Sort  (") || strings.Contains(line, "Sort (") {
			extra = "filesort"
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return typ, key, extra
}

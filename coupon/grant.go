package coupon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Config is the granter's settings. In the router's configuration they are
// plugins.coupon-granter.<key>, because the plugin declares Config as its Settings. Each
// setting's key, default, range and help are its tags. The runtime reads them as it reads
// its own settings.
type Config struct {
	CampaignID  string `key:"campaign_id" default:"double11-5yuan" help:"the campaign whose coupons are granted (1..64 bytes)"`
	ValueCents  int64  `key:"value_cents" default:"500" range:"1..9223372036854775807" help:"value of each coupon, in cents"`
	StockTotal  int64  `key:"stock_total" default:"100000000" range:"0..9223372036854775807" help:"coupons of the campaign; used when its counters are first created"`
	BudgetCents int64  `key:"budget_cents" default:"50000000000" range:"0..9223372036854775807" help:"budget of the campaign in cents; used when its counters are first created"`
	// Shards splits stock and budget over this many counter rows when the campaign is first
	// created, so concurrent grants do not queue on one row lock.
	Shards int `key:"shards" default:"16" range:"1..1024" help:"counter rows stock and budget are split over when the campaign is first created, so concurrent grants do not queue on one row lock"`

	GrantedTopic string `key:"granted_topic" default:"coupon-granted" help:"topic of the CouponGranted events"`
	FailedTopic  string `key:"failed_topic" default:"coupon-grant-failed" help:"topic of the CouponGrantFailed events"`

	// StepDelay, StepJitter and StepFailureRate simulate slow and flaky outside calls.
	// Every step sleeps StepDelay plus up to StepJitter, and fails with probability
	// StepFailureRate.
	StepDelay       time.Duration `key:"step_delay" range:"0..1h" help:"each step's simulated outside call takes this long (the incident's slow calls: e.g. 800ms)"`
	StepJitter      time.Duration `key:"step_jitter" range:"0..1h" help:"each step's simulated call takes up to this much longer than step_delay, at random"`
	StepFailureRate float64       `key:"step_failure_rate" range:"0..0.99" help:"share of the simulated calls that fail, each failure a failed attempt the inbox retries"`
	// Seed seeds the injected failures. The default 0 seeds each process differently, so
	// restarted or parallel routers do not replay one failure sequence.
	Seed uint64 `key:"seed" range:"0..18446744073709551615" help:"seed of the simulated failures; 0 seeds each process differently"`

	// DownstreamURL is the steps' real service, called by an httpService. Each call is a
	// POST to <url>/<step> with its idempotency key in the Idempotency-Key header. The
	// default, empty, keeps the simulated calls of the step_* settings.
	DownstreamURL      string        `key:"downstream_url" help:"the steps' real HTTP service instead of the simulated calls: a POST to this URL and /step for each call, its Idempotency-Key header the order id and the step; step_delay, step_jitter and step_failure_rate stay 0 with it"`
	DownstreamTimeout  time.Duration `key:"downstream_timeout" default:"5s" range:"1ms..10m" help:"bound of each call to downstream_url"`
	DownstreamMaxConns int           `key:"downstream_max_conns" default:"256" range:"1..65536" help:"most connections to downstream_url at once"`
}

// DefaultConfig returns every setting at its default. The default campaign grants a
// 5-yuan coupon with no threshold.
func DefaultConfig() Config {
	var c Config
	settings.SetDefaults(&c)
	return c
}

// Validate reports the first invalid setting. It checks the ranges first, then the rules
// the tags cannot state.
func (c Config) Validate() error {
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("coupon: %w", err)
	}
	switch {
	case c.CampaignID == "" || len(c.CampaignID) > 64:
		return fmt.Errorf("coupon: campaign_id %q must be 1..64 bytes", c.CampaignID)
	case c.GrantedTopic == "" || c.FailedTopic == "":
		return errors.New("coupon: granted_topic and failed_topic are required")
	case c.DownstreamURL == "":
	case c.StepDelay != 0 || c.StepJitter != 0 || c.StepFailureRate != 0:
		return errors.New("coupon: step_delay, step_jitter and step_failure_rate simulate the downstream: leave them 0 with downstream_url")
	default:
		return checkDownstreamURL(c.DownstreamURL)
	}
	return nil
}

// Granter is the coupon state machine. Each step's side effect and its optimistic-lock
// transition commit together, or not at all. A Granter is a typed inbox.Handler, made by
// inbox.Typed. It runs one step per Handle call and makes the step's outside call in the
// step's transaction. So it runs the state machine at its own pace, as the inbox's tests
// drive it. The plugin runs it through Handler instead, which finishes a grant in one
// transaction once its calls are made.
//
// Granter, NewGranter, ExternalService, EnsureCampaign and Verify are for onceflow's own
// tests and tools, such as the bench, which drive the grant without the runtime. A plugin
// never needs them, and the runtime builds the plugin through Plugin.
type Granter struct {
	*inbox.TypedHandler[OrderPaid]
	cfg    Config
	svc    ExternalService
	out    *outbox.Writer
	logger watermill.LoggerAdapter
	now    func() time.Time
	shards atomic.Int64            // the campaign's counter shards, read once from the database
	q      atomic.Pointer[sqlText] // the database's SQL, the pool's or asked of the server by textOf
}

// NewGranter builds a Granter. A nil svc makes no external calls.
func NewGranter(cfg Config, svc ExternalService, logger watermill.LoggerAdapter) (*Granter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if svc == nil {
		svc = (*simulatedService)(nil)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return newGranter(cfg, svc, logger, nil)
}

// newGranter is NewGranter with validated settings. Its outbox writer runs on prepared
// statements of pool db. When db is nil, the writer's statements are interpolated.
func newGranter(cfg Config, svc ExternalService, logger watermill.LoggerAdapter, db *sql.DB) (*Granter, error) {
	out, err := outbox.NewWriter("outbox")
	if err != nil {
		return nil, err
	}
	g := &Granter{cfg: cfg, svc: svc, out: out, logger: logger, now: time.Now}
	if db != nil {
		out.UseStatements(db)
		g.q.Store(textFor(dbx.DialectOf(db)))
	}
	g.TypedHandler = inbox.Typed[OrderPaid](orderCodec{}, func(ctx context.Context, tx *sql.Tx, _ *inbox.Delivery, o OrderPaid) (inbox.Progress, error) {
		return g.Step(ctx, tx, o)
	})
	return g, nil
}

// Config returns the granter's configuration.
func (g *Granter) Config() Config { return g.cfg }

// orderCodec decodes order-paid events for inbox.Typed. The dedup key is the order id, and
// the fingerprint is the order's meaning. The value's OrderID is the grant's id, given by
// GrantID. So an order whose id is in the claim namespace never takes a claim's grant.
type orderCodec struct{}

func (orderCodec) Decode(msg *message.Message) (OrderPaid, string, string, error) {
	o, err := DecodeOrderPaid(msg.Payload)
	if err != nil {
		return OrderPaid{}, "", "", err
	}
	key, fp := o.OrderID, o.Fingerprint()
	o.OrderID = GrantID(o.OrderID)
	return o, key, fp, nil
}

// Step advances the grant of o by one step within tx and makes the step's outside call
// there. It is exported so tests can drive the state machine without the inbox. The state
// machine is the second line of defence, and such tests check it on its own. Step takes
// o.OrderID as the grant's id. The inbox's deliveries pass GrantID of the order id.
func (g *Granter) Step(ctx context.Context, tx *sql.Tx, o OrderPaid) (inbox.Progress, error) {
	prog, _, err := g.advance(ctx, tx, o, nil, true)
	return prog, err
}

// advance runs the step the grant of o is due for, in tx. made reports whether a state's
// outside call is made already. A nil made means that none is. When the call is not made
// and call is set, advance makes it here. When call is not set, advance does nothing more
// and reports stepped false.
func (g *Granter) advance(ctx context.Context, tx *sql.Tx, o OrderPaid, made func(State) bool, call bool) (prog inbox.Progress, stepped bool, err error) {
	q, err := g.textOf(ctx, tx)
	if err != nil {
		return inbox.Continue, false, err
	}
	if _, ok := dbx.DialectFromContext(ctx); !ok { // the outbox writer's SQL, for a granter without a pool
		ctx = dbx.ContextWithDialect(ctx, q.d)
	}
	repo := sqlRepo{tx: tx, q: q}
	gr, err := repo.loadOrCreate(ctx, o, g.cfg.CampaignID, g.cfg.ValueCents)
	if err != nil {
		return inbox.Continue, false, err
	}
	if gr.State.terminal() {
		return inbox.Done, true, nil
	}
	shards, err := g.campaignShards(ctx, repo, gr.CampaignID)
	if err != nil {
		return inbox.Continue, false, err
	}
	if made == nil || !made(gr.State) {
		if !call {
			return inbox.Continue, false, nil
		}
		// The call was not made before the transaction. There is no Preparer, or another
		// delivery moved the grant on since. The call is made here, idempotent by order id
		// and step.
		step := gr.State.step()
		if err := g.svc.Call(ctx, step, gr.OrderID+":"+step); err != nil {
			return inbox.Continue, false, err
		}
	}
	switch gr.State {
	case StateInit:
		shard, err := repo.lockStock(ctx, gr, shards)
		if err != nil {
			return inbox.Continue, true, err
		}
		if shard < 0 {
			return inbox.Done, true, g.fail(ctx, tx, repo, gr, StateInit, errStockExhausted)
		}
		return inbox.Continue, true, repo.cas(ctx, gr, StateInit, StateLocked, "", "")
	case StateLocked:
		shard, err := repo.deductBudget(ctx, gr, shards)
		if err != nil {
			return inbox.Continue, true, err
		}
		if shard < 0 {
			if err := repo.releaseStock(ctx, gr); err != nil {
				return inbox.Continue, true, err
			}
			return inbox.Done, true, g.fail(ctx, tx, repo, gr, StateLocked, errBudgetExhausted)
		}
		return inbox.Continue, true, repo.cas(ctx, gr, StateLocked, StateBudgetDeducted, "", "")
	case StateBudgetDeducted:
		couponID := CouponID(gr.OrderID, gr.CampaignID)
		if err := repo.insertCoupon(ctx, gr, couponID); err != nil {
			return inbox.Continue, true, err
		}
		if err := repo.consumeStock(ctx, gr); err != nil {
			return inbox.Continue, true, err
		}
		if err := repo.cas(ctx, gr, StateBudgetDeducted, StateGranted, couponID, ""); err != nil {
			return inbox.Continue, true, err
		}
		if err := g.out.Add(ctx, tx, g.grantedEvent(gr, couponID, "")); err != nil {
			return inbox.Continue, true, err
		}
		g.logger.Debug("coupon granted", watermill.LogFields{"order_id": gr.OrderID, "coupon_id": couponID})
		return inbox.Done, true, nil
	}
	return inbox.Continue, true, fmt.Errorf("%w: no step from %s", errIllegalTransition, gr.State)
}

// grantedEvent is the CouponGranted event of grant gr, with traceParent. An empty
// traceParent takes the span of the ctx the event is added with.
func (g *Granter) grantedEvent(gr grantRow, couponID, traceParent string) outbox.Event {
	ev := GrantEvent{EventID: EventID(EventGranted, gr.OrderID, gr.CampaignID), OrderID: gr.OrderID, UserID: gr.UserID,
		CampaignID: gr.CampaignID, CouponID: couponID, ValueCents: gr.ValueCents, GrantedAt: g.now().UTC()}
	return outbox.Event{ID: ev.EventID, Type: EventGranted, Topic: g.cfg.GrantedTopic, Key: gr.OrderID, Payload: ev.Encode(), TraceParent: traceParent}
}

func (g *Granter) campaignShards(ctx context.Context, repo sqlRepo, campaignID string) (int, error) {
	if n := g.shards.Load(); n > 0 {
		return int(n), nil
	}
	n, err := repo.campaignShards(ctx, campaignID)
	if err != nil {
		return 0, err
	}
	g.shards.Store(int64(n))
	return n, nil
}

// fail ends the grant in FAILED and emits CouponGrantFailed in the same transaction. FAILED
// is a permanent business outcome, not an error of the step.
func (g *Granter) fail(ctx context.Context, tx *sql.Tx, repo sqlRepo, gr grantRow, from State, cause error) error {
	reason := "stock_exhausted"
	if errors.Is(cause, errBudgetExhausted) {
		reason = "budget_exhausted"
	}
	if err := repo.cas(ctx, gr, from, StateFailed, "", reason); err != nil {
		return err
	}
	ev := GrantEvent{EventID: EventID(EventGrantFailed, gr.OrderID, gr.CampaignID), OrderID: gr.OrderID, UserID: gr.UserID,
		CampaignID: gr.CampaignID, ValueCents: gr.ValueCents, Reason: reason, FailedAt: g.now().UTC()}
	g.logger.Info("coupon grant failed", watermill.LogFields{"order_id": gr.OrderID, "reason": reason})
	return g.out.Add(ctx, tx, outbox.Event{ID: ev.EventID, Type: EventGrantFailed, Topic: g.cfg.FailedTopic, Key: gr.OrderID, Payload: ev.Encode()})
}

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
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Config configures the granter (router.yaml: plugins.coupon-granter).
type Config struct {
	CampaignID  string `mapstructure:"campaign_id"`
	ValueCents  int64  `mapstructure:"value_cents"`
	StockTotal  int64  `mapstructure:"stock_total"`  // used when the campaign is first created
	BudgetCents int64  `mapstructure:"budget_cents"` // used when the campaign is first created
	// Shards splits stock and budget over this many counter rows when the campaign is first
	// created, so concurrent grants do not queue on one row lock. Default 16.
	Shards int `mapstructure:"shards"`

	GrantedTopic string `mapstructure:"granted_topic"`
	FailedTopic  string `mapstructure:"failed_topic"`

	// The seed incident's slow external calls: every step sleeps StepDelay (+ up to
	// StepJitter) and fails with probability StepFailureRate.
	StepDelay       time.Duration `mapstructure:"step_delay"`
	StepJitter      time.Duration `mapstructure:"step_jitter"`
	StepFailureRate float64       `mapstructure:"step_failure_rate"`
	// Seed of the injected failures; 0 (the default) seeds each process differently, so
	// restarted or parallel routers do not replay one failure sequence.
	Seed uint64 `mapstructure:"seed"`

	// DownstreamURL is the steps' real service (HTTPService): each call is POST
	// <url>/<step> with its idempotency key in the Idempotency-Key header. Empty (the
	// default) keeps the simulated calls of the step_* settings.
	DownstreamURL string `mapstructure:"downstream_url"`
	// DownstreamTimeout bounds each call to it; default 5s.
	DownstreamTimeout time.Duration `mapstructure:"downstream_timeout"`
	// DownstreamMaxConns bounds its connections; default 256.
	DownstreamMaxConns int `mapstructure:"downstream_max_conns"`
}

// DefaultConfig is the 5-yuan no-threshold coupon of the incident.
func DefaultConfig() Config {
	return Config{
		CampaignID:   "double11-5yuan",
		ValueCents:   500,
		StockTotal:   100_000_000,
		BudgetCents:  500 * 100_000_000,
		GrantedTopic: "coupon-granted",
		FailedTopic:  "coupon-grant-failed",
		Shards:       16,

		DownstreamTimeout:  5 * time.Second,
		DownstreamMaxConns: 256,
	}
}

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	switch {
	case c.CampaignID == "" || len(c.CampaignID) > 64:
		return fmt.Errorf("coupon: campaign_id %q must be 1..64 bytes", c.CampaignID)
	case c.ValueCents <= 0:
		return fmt.Errorf("coupon: value_cents %d must be positive", c.ValueCents)
	case c.Shards < 1 || c.Shards > 1024:
		return fmt.Errorf("coupon: shards %d outside 1..1024", c.Shards)
	case c.StockTotal < 0 || c.BudgetCents < 0:
		return errors.New("coupon: stock_total and budget_cents must not be negative")
	case c.StepFailureRate < 0 || c.StepFailureRate >= 1:
		return fmt.Errorf("coupon: step_failure_rate %v outside [0,1)", c.StepFailureRate)
	case c.StepDelay < 0 || c.StepJitter < 0:
		return errors.New("coupon: step_delay and step_jitter must not be negative")
	case c.GrantedTopic == "" || c.FailedTopic == "":
		return errors.New("coupon: granted_topic and failed_topic are required")
	case c.DownstreamTimeout <= 0 || c.DownstreamTimeout > 10*time.Minute:
		return fmt.Errorf("coupon: downstream_timeout %v outside (0,10m]", c.DownstreamTimeout)
	case c.DownstreamMaxConns < 1 || c.DownstreamMaxConns > 65536:
		return fmt.Errorf("coupon: downstream_max_conns %d outside 1..65536", c.DownstreamMaxConns)
	case c.DownstreamURL == "":
	case c.StepDelay != 0 || c.StepJitter != 0 || c.StepFailureRate != 0:
		return errors.New("coupon: step_delay, step_jitter and step_failure_rate simulate the downstream: leave them 0 with downstream_url")
	default:
		return checkDownstreamURL(c.DownstreamURL)
	}
	return nil
}

// Granter is the coupon state machine: each step's side effect and its optimistic-lock
// transition commit together, or not at all. As an inbox.Handler (a typed one, inbox.Typed)
// it runs one step per Handle call, the step's outside call made in its transaction: the
// state machine at its own pace, as the inbox's tests drive it. The plugin runs it through
// Handler, which finishes a grant in one transaction once its calls are made.
type Granter struct {
	*inbox.TypedHandler[OrderPaid]
	cfg    Config
	svc    ExternalService
	out    *outbox.Writer
	logger watermill.LoggerAdapter
	now    func() time.Time
	shards atomic.Int64            // the campaign's counter shards, read once from the database
	q      atomic.Pointer[sqlText] // the database's SQL: the pool's, or asked of the server (textOf)
}

// NewGranter builds a Granter. A nil svc makes no external calls.
func NewGranter(cfg Config, svc ExternalService, logger watermill.LoggerAdapter) (*Granter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if svc == nil {
		svc = (*SimulatedService)(nil)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return newGranter(cfg, svc, logger, nil)
}

// newGranter is NewGranter with validated settings; its outbox writer runs on pool db's
// prepared statements (nil: interpolated).
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

// orderCodec decodes order-paid events for inbox.Typed: the dedup key is the order id, the
// fingerprint the order's meaning. The value's OrderID is the grant's id (GrantID), so an
// order whose id is in the claim namespace never takes a claim's grant.
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

// Step advances the grant of o by one step within tx, its outside call made there. It is
// exported so tests can drive the state machine without the inbox (the second line of
// defence on its own). o.OrderID is the grant's id as it is: the inbox's deliveries pass
// GrantID of the order id.
func (g *Granter) Step(ctx context.Context, tx *sql.Tx, o OrderPaid) (inbox.Progress, error) {
	prog, _, err := g.advance(ctx, tx, o, nil, true)
	return prog, err
}

// advance runs the step the grant of o is due for, in tx. made reports whether a state's
// outside call is made already (nil: none is); one that is not is made here when call is
// set, else advance does nothing more and reports stepped false.
func (g *Granter) advance(ctx context.Context, tx *sql.Tx, o OrderPaid, made func(State) bool, call bool) (prog inbox.Progress, stepped bool, err error) {
	q, err := g.textOf(ctx, tx)
	if err != nil {
		return inbox.Continue, false, err
	}
	if _, ok := dbx.DialectFromContext(ctx); !ok { // the outbox writer's SQL (a granter without a pool)
		ctx = dbx.ContextWithDialect(ctx, q.d)
	}
	repo := sqlRepo{tx: tx, q: q}
	gr, err := repo.loadOrCreate(ctx, o, g.cfg.CampaignID, g.cfg.ValueCents)
	if err != nil {
		return inbox.Continue, false, err
	}
	if gr.State.Terminal() {
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
		// Not made before the transaction (no Preparer, or another delivery moved the grant
		// on since): made here, idempotent by order id and step.
		step := gr.State.Step()
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
			return inbox.Done, true, g.fail(ctx, tx, repo, gr, StateInit, ErrStockExhausted)
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
			return inbox.Done, true, g.fail(ctx, tx, repo, gr, StateLocked, ErrBudgetExhausted)
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
	return inbox.Continue, true, fmt.Errorf("%w: no step from %s", ErrIllegalTransition, gr.State)
}

// grantedEvent is the CouponGranted event of grant gr, with traceParent (empty: the span of
// the ctx it is added with).
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

// fail ends the grant in FAILED (a permanent business outcome, not an error of the step)
// and emits CouponGrantFailed in the same transaction.
func (g *Granter) fail(ctx context.Context, tx *sql.Tx, repo sqlRepo, gr grantRow, from State, cause error) error {
	reason := "stock_exhausted"
	if errors.Is(cause, ErrBudgetExhausted) {
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

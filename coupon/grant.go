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
	}
	return nil
}

// Granter is the inbox handler that grants coupons for paid orders. Each Handle call runs
// one step of the state machine: the step's side effect and its optimistic-lock transition
// commit together, or not at all.
type Granter struct {
	cfg    Config
	svc    ExternalService
	out    *outbox.Writer
	logger watermill.LoggerAdapter
	now    func() time.Time
	shards atomic.Int64     // the campaign's counter shards, read once from the database
	db     *sql.DB          // set by UsePrepare: external calls then happen outside transactions
	st     *batchStatements // HandleBatch's inserts; prepared on a pool after UseStatements
	// batchSeq rotates the counter shard batches start at, so concurrent batches take
	// different shard rows.
	batchSeq atomic.Int64
}

var (
	_ inbox.Handler  = (*Granter)(nil)
	_ inbox.Preparer = (*Granter)(nil)
)

// UsePrepare makes the granter call its external services in Prepare, before each step's
// transaction, reading the grant's committed state from db: a slow call then holds no
// database lock. Without it (tests, the bench's unsafe baseline) the call happens inside the
// step's transaction.
func (g *Granter) UsePrepare(db *sql.DB) *Granter {
	g.db = db
	return g
}

// Prepare implements inbox.Preparer: it makes the external call of the step the grant is
// due for, outside any transaction, and leaves the state it prepared in d.Prepared.
func (g *Granter) Prepare(ctx context.Context, d *inbox.Delivery) error {
	o, ok := d.Value.(OrderPaid)
	if g.db == nil || !ok {
		return nil
	}
	st, err := readState(ctx, g.db, o.OrderID, g.cfg.CampaignID)
	if err != nil || st.Terminal() {
		return err
	}
	step := st.Step()
	if err := g.svc.Call(ctx, step, o.OrderID+":"+step); err != nil {
		return err
	}
	d.Prepared = st
	return nil
}

// NewGranter builds a Granter. A nil svc makes no external calls.
func NewGranter(cfg Config, svc ExternalService, logger watermill.LoggerAdapter) (*Granter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	out, err := outbox.NewWriter("outbox")
	if err != nil {
		return nil, err
	}
	if svc == nil {
		svc = (*SimulatedService)(nil)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Granter{cfg: cfg, svc: svc, out: out, logger: logger, now: time.Now, st: newBatchStatements(nil)}, nil
}

// Config returns the granter's configuration.
func (g *Granter) Config() Config { return g.cfg }

// Decode implements inbox.Handler: the dedup key is the order id.
func (g *Granter) Decode(msg *message.Message) (inbox.Decoded, error) {
	o, err := DecodeOrderPaid(msg.Payload)
	if err != nil {
		return inbox.Decoded{}, inbox.PoisonError("%v", err)
	}
	return inbox.Decoded{Key: o.OrderID, Fingerprint: o.Fingerprint(), Value: o}, nil
}

// Handle implements inbox.Handler: it advances the grant by one step.
func (g *Granter) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	o, ok := d.Value.(OrderPaid)
	if !ok {
		return inbox.Done, inbox.Permanent(fmt.Errorf("coupon: unexpected value %T", d.Value))
	}
	prepared, _ := d.Prepared.(State)
	d.Prepared = nil // one prepared call serves one step
	return g.step(ctx, tx, o, prepared)
}

// Step advances the grant of o by one step within tx. It is exported so tests can drive the
// state machine without the inbox (the second line of defence on its own).
func (g *Granter) Step(ctx context.Context, tx *sql.Tx, o OrderPaid) (inbox.Progress, error) {
	return g.step(ctx, tx, o, "")
}

// step advances the grant by one step; prepared is the state whose external call Prepare
// already made ("" for none).
func (g *Granter) step(ctx context.Context, tx *sql.Tx, o OrderPaid, prepared State) (inbox.Progress, error) {
	repo := mysqlRepo{tx: tx}
	gr, err := repo.loadOrCreate(ctx, o, g.cfg.CampaignID, g.cfg.ValueCents)
	if err != nil {
		return inbox.Continue, err
	}
	if gr.State.Terminal() {
		return inbox.Done, nil
	}
	shards, err := g.campaignShards(ctx, repo, gr.CampaignID)
	if err != nil {
		return inbox.Continue, err
	}
	if prepared != gr.State {
		// Not prepared, or another delivery moved the grant on since: make the call here
		// (idempotent by order id and step).
		step := gr.State.Step()
		if err := g.svc.Call(ctx, step, gr.OrderID+":"+step); err != nil {
			return inbox.Continue, err
		}
	}
	switch gr.State {
	case StateInit:
		shard, err := repo.lockStock(ctx, gr, shards)
		if err != nil {
			return inbox.Continue, err
		}
		if shard < 0 {
			return inbox.Done, g.fail(ctx, tx, repo, gr, StateInit, ErrStockExhausted)
		}
		return inbox.Continue, repo.cas(ctx, gr, StateInit, StateLocked, "", "")
	case StateLocked:
		shard, err := repo.deductBudget(ctx, gr, shards)
		if err != nil {
			return inbox.Continue, err
		}
		if shard < 0 {
			if err := repo.releaseStock(ctx, gr); err != nil {
				return inbox.Continue, err
			}
			return inbox.Done, g.fail(ctx, tx, repo, gr, StateLocked, ErrBudgetExhausted)
		}
		return inbox.Continue, repo.cas(ctx, gr, StateLocked, StateBudgetDeducted, "", "")
	case StateBudgetDeducted:
		couponID := CouponID(gr.OrderID, gr.CampaignID)
		if err := repo.insertCoupon(ctx, gr, couponID); err != nil {
			return inbox.Continue, err
		}
		if err := repo.consumeStock(ctx, gr); err != nil {
			return inbox.Continue, err
		}
		if err := repo.cas(ctx, gr, StateBudgetDeducted, StateGranted, couponID, ""); err != nil {
			return inbox.Continue, err
		}
		ev := GrantEvent{EventID: EventID(EventGranted, gr.OrderID, gr.CampaignID), OrderID: gr.OrderID, UserID: gr.UserID,
			CampaignID: gr.CampaignID, CouponID: couponID, ValueCents: gr.ValueCents, GrantedAt: g.now().UTC()}
		if err := g.out.Add(ctx, tx, outbox.Event{ID: ev.EventID, Type: EventGranted, Topic: g.cfg.GrantedTopic, Key: gr.OrderID, Payload: ev.Encode()}); err != nil {
			return inbox.Continue, err
		}
		g.logger.Debug("coupon granted", watermill.LogFields{"order_id": gr.OrderID, "coupon_id": couponID})
		return inbox.Done, nil
	}
	return inbox.Continue, fmt.Errorf("%w: no step from %s", ErrIllegalTransition, gr.State)
}

func (g *Granter) campaignShards(ctx context.Context, repo mysqlRepo, campaignID string) (int, error) {
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
func (g *Granter) fail(ctx context.Context, tx *sql.Tx, repo mysqlRepo, gr grantRow, from State, cause error) error {
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

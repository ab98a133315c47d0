package coupon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// The plugin's handler, written on the contract a plugin author sees: a typed handler of
// OrderPaid (inbox.Typed) whose Handle writes its rows through inbox.Inserters and its
// event through outbox.Writer.Add, and, when the outside service is slow, a Preparer that
// makes the grant's calls before the transaction. Once a grant's calls are made, Handle
// runs it to its end in one transaction; a new grant goes straight to GRANTED (every legal
// transition logged), taking its stock and budget in one statement. HandleBatch, the
// expert path of group commit, does the same for a whole batch with multi-row statements
// (batch.go).

// handler is the plugin's handler (Granter.Handler) or the claim command's
// (Granter.ClaimHandler).
type handler struct {
	*inbox.TypedHandler[OrderPaid]
	g    *Granter // with an outbox writer on db's prepared statements
	db   *sql.DB
	free bool // the outside service answers at once: calls are made in the transaction

	grants, logs, coupons *inbox.Inserter
	st                    *batchStatements // HandleBatch's
	shards                txShards
	claims                bool // the claim command: Handle and HandleBatch state each claim's answer
}

// slowHandler is handler with a Preparer: the calls of a grant's remaining steps are made
// before its transaction.
type slowHandler struct {
	*handler
	made *madeCalls // calls that succeeded, not made again by a later attempt
}

var (
	_ inbox.Handler      = (*handler)(nil)
	_ inbox.BatchHandler = (*handler)(nil)
	_ inbox.Preparer     = (*slowHandler)(nil)
)

// Handler returns the granter as the plugin runs it, on pool db (its inserts prepared
// there, the transactions it is given db's): a Preparer when the outside service is slow.
// Close it once it is no longer used.
func (g *Granter) Handler(db *sql.DB) (inbox.Handler, error) {
	return g.handler(db, orderCodec{}, false)
}

// handler builds the plugin's handler decoding with codec; claims: the claim command's.
func (g *Granter) handler(db *sql.DB, codec inbox.Codec[OrderPaid], claims bool) (inbox.Handler, error) {
	if db == nil {
		return nil, errors.New("coupon: the handler needs a database")
	}
	hg, err := newGranter(g.cfg, g.svc, g.logger, db)
	if err != nil {
		return nil, err
	}
	hg.now = g.now
	ins := func(table string, columns ...string) *inbox.Inserter {
		i, err2 := inbox.NewInserter(table, columns...)
		if err2 != nil {
			err = err2
			return nil
		}
		return i.UseStatements(db)
	}
	h := &handler{g: hg, db: db, free: instant(g.svc), claims: claims, st: newBatchStatements(db),
		grants:  ins("coupon_grant", "order_id", "campaign_id", "user_id", "state", "version", "value_cents", "stock_shard", "budget_shard", "coupon_id"),
		logs:    ins("coupon_grant_log", "order_id", "campaign_id", "from_state", "to_state"),
		coupons: ins("user_coupon", "coupon_id", "order_id", "campaign_id", "user_id", "value_cents"),
	}
	if err != nil {
		return nil, err
	}
	h.TypedHandler = inbox.Typed(codec, h.handle)
	if h.free {
		return h, nil
	}
	return &slowHandler{handler: h, made: newMadeCalls(madeCallsKept)}, nil
}

// Close closes the prepared statements of the handler's inserts.
func (h *handler) Close() error {
	return errors.Join(h.grants.Close(), h.logs.Close(), h.coupons.Close(), h.st.close(), h.g.out.Close())
}

// Prepare implements inbox.Preparer: it reads the grant's committed state and makes the
// outside calls of every step still due from it (idempotent by order id and step), outside
// any transaction; d.Prepared is that state. A finished grant makes none. A call that
// succeeded in an earlier attempt whose grant did not commit is not made again (madeCalls).
func (h *slowHandler) Prepare(ctx context.Context, d *inbox.Delivery) error {
	o, ok := d.Value.(OrderPaid)
	if !ok {
		return nil // Handle refuses it
	}
	st, err := readState(ctx, h.db, o.OrderID, h.g.cfg.CampaignID)
	if err != nil {
		return err
	}
	if st.Terminal() {
		h.made.forget(callKeys(o.OrderID)...)
		return nil
	}
	for s := st; !s.Terminal(); s = s.Next() {
		key := o.OrderID + ":" + s.Step()
		if h.made.has(key) {
			continue
		}
		if err := h.g.svc.Call(ctx, s.Step(), key); err != nil {
			if s == st {
				return err // nothing made: the attempt failed
			}
			// The steps before s were made: Handle commits them, and the next step's
			// Prepare makes s's call again. A router that runs the grant later starts
			// from s, not from the calls that succeeded.
			d.Prepared = partialGrant{from: st, upto: s}
			return nil
		}
		h.made.add(key)
	}
	d.Prepared = st
	return nil
}

// partialGrant is what Prepare made when a call failed after earlier ones of the grant
// succeeded: the calls of the steps from from up to (not including) upto.
type partialGrant struct{ from, upto State }

// callKeys are the idempotency keys of an order's grant calls.
func callKeys(orderID string) []string {
	keys := make([]string, len(grantSteps))
	for i, s := range grantSteps {
		keys[i] = orderID + ":" + s
	}
	return keys
}

// handle is the handler's inbox.TypedFunc: the grant, and a claim's answer.
func (h *handler) handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderPaid) (inbox.Progress, error) {
	prog, err := h.grant(ctx, tx, d, o)
	if err != nil || prog != inbox.Done || !h.claims {
		return prog, err
	}
	return inbox.Done, h.respond(ctx, tx, []*inbox.Delivery{d})
}

// grant runs the grant of o in tx as far as its outside calls are made: to its end when
// Prepare made them all (or the service answers at once); as far as Prepare got when one
// of its calls failed (Continue: the next step's Prepare calls again); else one step, its
// call made here (the grant moved on since Prepare read it).
func (h *handler) grant(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderPaid) (inbox.Progress, error) {
	from, prepared := d.Prepared.(State)
	partial, isPartial := d.Prepared.(partialGrant)
	if !d.Resumed && (h.free || prepared && from == StateInit) {
		// A new inbox row: its grant almost never exists yet.
		ok, err := h.grantNew(ctx, tx, o)
		if err != nil || ok {
			return inbox.Done, err
		}
	}
	var made func(State) bool
	switch {
	case prepared:
		made = func(s State) bool { return s.index() >= from.index() }
	case isPartial:
		made = func(s State) bool { return s.index() >= partial.from.index() && s.index() < partial.upto.index() }
	}
	for i := 0; ; i++ {
		prog, stepped, err := h.g.advance(ctx, tx, o, made, (i == 0 || h.free) && !isPartial)
		if err != nil || prog == inbox.Done || !stepped {
			return prog, err
		}
	}
}

// grantSteps are the outside calls of a grant, in order.
var grantSteps = []string{StateInit.Step(), StateLocked.Step(), StateBudgetDeducted.Step()}

// grantPath is a new grant's transitions, each legal (Transit).
var grantPath = []State{StateInit, StateLocked, StateBudgetDeducted, StateGranted}

// grantNew grants o, whose grant does not exist yet, at once: its stock and budget taken in
// one statement from the shard tx holds, the grant inserted GRANTED with the one transition
// it commits logged (INIT → GRANTED, each step checked), its coupon and its CouponGranted event — the rows through Inserters
// and the outbox writer, so in a group-committed batch they go out with the batch's
// multi-row inserts. It reports false, having changed nothing, when no shard covers the
// coupon (exhaustion: the state machine fails the grant) or the grant exists after all (a
// message replayed after its inbox row expired; in a batch the grant's insert then fails
// the batch, whose deliveries run again one transaction each).
func (h *handler) grantNew(ctx context.Context, tx *sql.Tx, o OrderPaid) (bool, error) {
	g := h.g
	if h.free {
		for _, step := range grantSteps {
			if err := g.svc.Call(ctx, step, o.OrderID+":"+step); err != nil {
				return false, err
			}
		}
	}
	repo := sqlRepo{tx: tx, q: g.q.Load()}
	shards, err := g.campaignShards(ctx, repo, g.cfg.CampaignID)
	if err != nil {
		return false, err
	}
	shard, err := h.shards.take(ctx, repo, g.cfg.CampaignID, o.OrderID, g.cfg.ValueCents, shards)
	if err != nil || shard < 0 {
		return false, err
	}
	gr := grantRow{OrderID: o.OrderID, CampaignID: g.cfg.CampaignID, UserID: o.UserID, State: StateGranted, ValueCents: g.cfg.ValueCents, StockShard: shard, BudgetShard: shard}
	couponID := CouponID(o.OrderID, gr.CampaignID)
	err = h.grants.Insert(ctx, tx, gr.OrderID, gr.CampaignID, gr.UserID, string(StateGranted), len(grantPath)-1, gr.ValueCents, shard, shard, couponID)
	if dbx.IsDuplicate(err) && repo.q.giveBack != "" {
		// MySQL family only: on PostgreSQL the failed insert aborted the transaction (and
		// takeNew took nothing for an order whose grant exists, so only a grant inserted
		// meanwhile gets here: the delivery is retried and finds it).
		return false, repo.giveBack(ctx, gr.CampaignID, shard, gr.ValueCents)
	}
	if err != nil {
		return false, err
	}
	// The grant commits GRANTED at once: its one committed transition (logAndIssue).
	if err := checkPath(grantPath); err != nil {
		return false, err
	}
	if err := h.logs.Insert(ctx, tx, gr.OrderID, gr.CampaignID, string(StateInit), string(StateGranted)); err != nil {
		return false, err
	}
	if err := h.coupons.Insert(ctx, tx, couponID, gr.OrderID, gr.CampaignID, gr.UserID, gr.ValueCents); err != nil {
		return false, err
	}
	if err := g.out.Add(ctx, tx, g.grantedEvent(gr, couponID, "")); err != nil {
		return false, err
	}
	return true, nil
}

// txShards takes single coupons from the counter shard a transaction took its last one
// from. The deliveries of a group-committed batch share its transaction, so they take their
// stock and budget from a shard row it has locked already, and batches running at once
// (each starting at another shard) do not wait on each other's rows — nor deadlock, as
// batches taking each delivery's coupon from a shard of its own would.
type txShards struct {
	mu   sync.Mutex
	last map[*sql.Tx]int
	next atomic.Int64 // the shard a transaction without one starts at, rotating
}

// txShardsKept bounds the transactions txShards remembers; it forgets them all past it.
const txShardsKept = 4096

// take takes one coupon of value cents for order from a shard with enough stock and
// budget, starting at the one tx took its last from; -1 when no shard has (nothing was
// taken), or, on PostgreSQL, when the order's grant exists.
func (s *txShards) take(ctx context.Context, repo sqlRepo, campaignID, order string, value int64, shards int) (int, error) {
	s.mu.Lock()
	start, ok := s.last[repo.tx]
	s.mu.Unlock()
	if !ok {
		start = int(s.next.Add(1))
	}
	shard, err := repo.takeBatch(ctx, campaignID, order, 1, value, start, shards)
	if err != nil || shard < 0 {
		return shard, err
	}
	s.mu.Lock()
	if s.last == nil || len(s.last) >= txShardsKept {
		s.last = make(map[*sql.Tx]int)
	}
	s.last[repo.tx] = shard
	s.mu.Unlock()
	return shard, nil
}

// giveBack returns one coupon of value cents to shard (takeBatch's undo; MySQL family).
func (r sqlRepo) giveBack(ctx context.Context, campaignID string, shard int, value int64) error {
	if _, err := r.tx.ExecContext(ctx, r.q.giveBack, value, campaignID, shard); err != nil {
		return fmt.Errorf("give back stock and budget: %w", err)
	}
	return nil
}

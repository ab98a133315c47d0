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

// The plugin's handler is written on the contract a plugin author sees. It is a typed
// handler of OrderPaid, made by inbox.Typed. Its Handle writes its rows through
// inbox.Inserters and its event through outbox.Writer.Add. When the outside service is
// slow, the handler is also a Preparer that makes the grant's calls before the
// transaction. Once a grant's calls are made, Handle runs it to its end in one
// transaction. A new grant goes straight to GRANTED and takes its stock and budget in one
// statement. Every step it passes is checked against the state machine. HandleBatch, the
// expert path of group commit in batch.go, does the same for a whole batch with multi-row
// statements.

// handler is the plugin's handler, built by Granter.Handler, or the claim command's, built
// by Granter.ClaimHandler.
type handler struct {
	*inbox.TypedHandler[OrderPaid]
	g    *Granter // with an outbox writer on db's prepared statements
	db   *sql.DB
	free bool // the outside service answers at once, so calls are made in the transaction

	grants, logs, coupons *inbox.Inserter
	st                    *batchStatements // HandleBatch's
	shards                txShards
	claims                bool // the claim command's handler, whose Handle and HandleBatch state each claim's answer
}

// slowHandler is handler with a Preparer. It makes the calls of a grant's remaining steps
// before the grant's transaction.
type slowHandler struct {
	*handler
	made *madeCalls // calls that succeeded, not made again by a later attempt
}

var (
	_ inbox.Handler      = (*handler)(nil)
	_ inbox.BatchHandler = (*handler)(nil)
	_ inbox.Preparer     = (*slowHandler)(nil)
)

// Handler returns the granter as the plugin runs it, on pool db. Its inserts are prepared
// on db, and the transactions it is given must belong to db. The handler is also a
// Preparer when the outside service is slow. Close it once it is no longer used.
func (g *Granter) Handler(db *sql.DB) (inbox.Handler, error) {
	return g.handler(db, orderCodec{}, false)
}

// handler builds the plugin's handler, which decodes with codec. With claims set it builds
// the claim command's handler.
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

// Prepare implements inbox.Preparer. It reads the grant's committed state and makes the
// outside calls of every step still due from it, outside any transaction. The calls are
// idempotent by order id and step. Prepare sets d.Prepared to the state it read. A
// finished grant makes no calls. A call that succeeded in an earlier attempt, whose grant
// did not commit, is not made again. madeCalls remembers such calls.
func (h *slowHandler) Prepare(ctx context.Context, d *inbox.Delivery) error {
	o, ok := d.Value.(OrderPaid)
	if !ok {
		return nil // Handle refuses it
	}
	st, err := readState(ctx, h.db, o.OrderID, h.g.cfg.CampaignID)
	if err != nil {
		return err
	}
	if st.terminal() {
		h.made.forget(callKeys(o.OrderID)...)
		return nil
	}
	for s := st; !s.terminal(); s = s.next() {
		key := o.OrderID + ":" + s.step()
		if h.made.has(key) {
			continue
		}
		if err := h.g.svc.Call(ctx, s.step(), key); err != nil {
			if s == st {
				return err // nothing was made, so the attempt failed
			}
			// The steps before s were made. Handle commits them, and the next step's
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

// partialGrant is what Prepare made when a call failed after earlier calls of the grant
// succeeded. It holds the calls of the steps from from up to upto, without upto.
type partialGrant struct{ from, upto State }

// callKeys are the idempotency keys of an order's grant calls.
func callKeys(orderID string) []string {
	keys := make([]string, len(grantSteps))
	for i, s := range grantSteps {
		keys[i] = orderID + ":" + s
	}
	return keys
}

// handle is the handler's inbox.TypedFunc. It runs the grant and states a claim's answer.
func (h *handler) handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderPaid) (inbox.Progress, error) {
	prog, err := h.grant(ctx, tx, d, o)
	if err != nil || prog != inbox.Done || !h.claims {
		return prog, err
	}
	return inbox.Done, h.respond(ctx, tx, []*inbox.Delivery{d})
}

// grant runs the grant of o in tx as far as its outside calls are made. It runs to the end
// when Prepare made them all, or when the service answers at once. When one of Prepare's
// calls failed, it runs as far as Prepare got and returns Continue, and the next step's
// Prepare calls again. Otherwise the grant moved on since Prepare read it, and grant runs
// one step whose call it makes here.
func (h *handler) grant(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderPaid) (inbox.Progress, error) {
	from, prepared := d.Prepared.(State)
	partial, isPartial := d.Prepared.(partialGrant)
	if !d.Resumed && (h.free || prepared && from == StateInit) {
		// The inbox row is new, so its grant almost never exists yet.
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
var grantSteps = []string{StateInit.step(), StateLocked.step(), StateBudgetDeducted.step()}

// grantPath is a new grant's transitions. transit accepts each of them.
var grantPath = []State{StateInit, StateLocked, StateBudgetDeducted, StateGranted}

// grantNew grants o at once, when o's grant does not exist yet. It takes the stock and
// budget in one statement from the shard tx holds. It inserts the grant as GRANTED and logs
// the one transition it commits, INIT → GRANTED, after checking each step. It writes the
// coupon and the CouponGranted event. The rows go through Inserters and the outbox writer,
// so in a group-committed batch they go out with the batch's multi-row inserts.
//
// grantNew reports false, having changed nothing, in two cases. No shard may cover the
// coupon, and then the state machine fails the grant as exhausted. Or the grant may exist
// after all, when a message is replayed after its inbox row expired. In a batch the
// grant's insert then fails the batch, whose deliveries run again in one transaction each.
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
		// Only the MySQL family gets here. On PostgreSQL the failed insert aborted the
		// transaction. There takeNew took nothing for an order whose grant exists, so only
		// a grant inserted meanwhile fails the insert. The delivery is retried and finds it.
		return false, repo.giveBack(ctx, gr.CampaignID, shard, gr.ValueCents)
	}
	if err != nil {
		return false, err
	}
	// The grant commits GRANTED at once, so it logs one committed transition, as
	// logAndIssue does.
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
// from. The deliveries of a group-committed batch share its transaction. So they take their
// stock and budget from a shard row the transaction has locked already. Batches running at
// once each start at another shard, so they do not wait on each other's rows. Nor do they
// deadlock, as batches taking each delivery's coupon from a shard of its own would.
type txShards struct {
	mu   sync.Mutex
	last map[*sql.Tx]int
	next atomic.Int64 // the rotating shard a transaction without one starts at
}

// txShardsKept bounds the transactions txShards remembers. Past it, txShards forgets them
// all.
const txShardsKept = 4096

// take takes one coupon of value cents for order from a shard with enough stock and
// budget. It starts at the shard tx took its last coupon from. It returns -1, having taken
// nothing, when no shard has enough. On PostgreSQL it also returns -1 when the order's
// grant exists.
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

// giveBack returns one coupon of value cents to shard. It undoes takeBatch, in the MySQL
// family only.
func (r sqlRepo) giveBack(ctx context.Context, campaignID string, shard int, value int64) error {
	if _, err := r.tx.ExecContext(ctx, r.q.giveBack, value, campaignID, shard); err != nil {
		return fmt.Errorf("give back stock and budget: %w", err)
	}
	return nil
}

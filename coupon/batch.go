package coupon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// batchStatements are the multi-row inserts of HandleBatch's common path. They are
// server-side prepared statements, made by dbx.MultiRow. MariaDB then parses each shape
// once per connection instead of lexing every literal of every row. See
// docs/BENCHMARKS.md, section "Prepared multi-row statements".
type batchStatements struct {
	grant, log, coupon *dbx.MultiRow
}

// newBatchStatements builds the batch's inserts on pool db, prepared there at their first
// use.
func newBatchStatements(db *sql.DB) *batchStatements {
	q := textFor(dbx.DialectOf(db))
	multi := func(width, max int, head, group, tail string) *dbx.MultiRow {
		return dbx.NewMultiRow(db, width, max, func(n int) string { return q.d.Rebind(head + groups(group, n) + tail) })
	}
	return &batchStatements{
		grant: multi(7, 512, `INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, version, value_cents, stock_shard, budget_shard, coupon_id) VALUES `,
			"(?, ?, ?, 'GRANTED', 3, ?, ?, ?, ?)", q.batchGrantTail),
		log:    multi(4, 512, `INSERT INTO coupon_grant_log (order_id, campaign_id, from_state, to_state) VALUES `, "(?, ?, ?, ?)", ""),
		coupon: multi(5, 512, `INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES `, "(?, ?, ?, ?, ?)", ""),
	}
}

func (st *batchStatements) close() error {
	return errors.Join(st.grant.Close(), st.log.Close(), st.coupon.Close())
}

// HandleBatch implements inbox.BatchHandler, the expert path of group commit. It runs the
// happy path of many grants in one transaction. Grants still in INIT whose calls are made
// go straight to GRANTED. One update takes the stock and budget of the whole batch
// together, from one counter shard. Multi-row statements write the grants, their
// transition log, the coupons and the CouponGranted events. Grants already terminal are
// Done.
//
// Every other delivery is left at Continue for Handle, which knows every path, exhaustion
// included. Such a delivery may have a grant that an earlier delivery left half-way. No
// shard may cover the whole batch, because the campaign runs out. Or the delivery's calls
// may fail here.
func (h *handler) HandleBatch(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	g := h.g
	progs := make([]inbox.Progress, len(ds))
	var orders []OrderPaid
	var idx []int
	var traces map[string]string // order id to its delivery's traceparent, when the inbox traces
	resumed := false             // some delivery resumes a row an earlier delivery left unfinished
	for i, d := range ds {
		progs[i] = inbox.Continue
		o, ok := d.Value.(OrderPaid)
		if from, prepared := d.Prepared.(State); !ok || !h.free && !(prepared && from == StateInit) {
			continue
		}
		if h.free && !h.callAll(ctx, o) {
			continue
		}
		orders = append(orders, o)
		idx = append(idx, i)
		resumed = resumed || d.Resumed
		if tp := d.TraceParent(); tp != "" {
			if traces == nil {
				traces = make(map[string]string, len(ds))
			}
			traces[o.OrderID] = tp
		}
	}
	if len(orders) == 0 {
		return progs, nil
	}
	repo := sqlRepo{tx: tx, q: g.q.Load(), st: h.st}
	shards, err := g.campaignShards(ctx, repo, g.cfg.CampaignID)
	if err != nil {
		return nil, err
	}
	done := func(is []int) ([]inbox.Progress, error) {
		for _, i := range is {
			progs[i] = inbox.Done
		}
		if !h.claims {
			return progs, nil
		}
		var finished []*inbox.Delivery
		for i, d := range ds {
			if progs[i] == inbox.Done {
				finished = append(finished, d)
			}
		}
		return progs, h.respond(ctx, tx, finished)
	}
	if !resumed {
		// The inbox rows are new, so their grants almost never exist yet. Write them
		// GRANTED at once.
		ok, err := h.grantBatchNew(ctx, tx, repo, orders, shards, traces)
		if err != nil {
			return nil, err
		}
		if ok {
			return done(idx)
		}
	}
	grants, err := repo.loadOrCreateMany(ctx, orders, g.cfg.CampaignID, g.cfg.ValueCents)
	if err != nil {
		return nil, err
	}
	var fresh []grantRow
	var freshIdx, terminal []int
	var value int64
	for j, gr := range grants {
		switch {
		case gr.State.terminal():
			terminal = append(terminal, idx[j])
		case gr.State == StateInit:
			fresh = append(fresh, gr)
			freshIdx = append(freshIdx, idx[j])
			value += gr.ValueCents
		}
	}
	if len(fresh) == 0 {
		return done(terminal)
	}
	shard, err := repo.takeBatch(ctx, g.cfg.CampaignID, "", int64(len(fresh)), value, int(h.shards.next.Add(1)), shards)
	if err != nil {
		return nil, err
	}
	if shard < 0 {
		return done(terminal) // no shard covers the whole batch, so Handle takes one at a time
	}
	for j := range fresh {
		fresh[j].StockShard, fresh[j].BudgetShard = shard, shard
	}
	if err := repo.grantMany(ctx, fresh); err != nil {
		return nil, err
	}
	if err := g.out.AddBatch(ctx, tx, h.grantedEvents(fresh, traces)); err != nil {
		return nil, err
	}
	return done(append(terminal, freshIdx...))
}

// callAll makes the outside calls of every step of o's grant. The service is instant, so
// the calls are made in the batch's transaction. callAll returns false when one fails, and
// the delivery is left to Handle.
func (h *handler) callAll(ctx context.Context, o OrderPaid) bool {
	for _, step := range grantSteps {
		if err := h.g.svc.Call(ctx, step, o.OrderID+":"+step); err != nil {
			return false
		}
	}
	return true
}

// grantBatchNew is the common case of HandleBatch. Its deliveries' inbox rows are new, so
// their grants do not exist yet. It takes the stock and budget of the whole batch from one
// counter shard. It inserts the grants directly as GRANTED, without first creating them in
// INIT and then updating them. It writes their transition log, the coupons and the events.
//
// A grant may exist after all, when a message is replayed after its inbox row expired. The
// insert then leaves it alone, everything since the savepoint is rolled back, and
// grantBatchNew reports false. The caller then takes the general path. grantBatchNew also
// reports false, having changed nothing, when no shard covers the batch.
func (h *handler) grantBatchNew(ctx context.Context, tx *sql.Tx, repo sqlRepo, orders []OrderPaid, shards int, traces map[string]string) (bool, error) {
	g := h.g
	if _, err := tx.ExecContext(ctx, "SAVEPOINT grant_new"); err != nil {
		return false, fmt.Errorf("savepoint: %w", err)
	}
	n := int64(len(orders))
	shard, err := repo.takeBatch(ctx, g.cfg.CampaignID, "", n, n*g.cfg.ValueCents, int(h.shards.next.Add(1)), shards)
	if err != nil || shard < 0 {
		return false, err
	}
	gs := make([]grantRow, len(orders))
	for i, o := range orders {
		gs[i] = grantRow{OrderID: o.OrderID, CampaignID: g.cfg.CampaignID, UserID: o.UserID, State: StateGranted, ValueCents: g.cfg.ValueCents, StockShard: shard, BudgetShard: shard}
	}
	bx := boxAll(gs)
	args := make([]any, 0, len(orders)*7)
	for _, b := range bx {
		args = append(args, b.order, b.campaign, b.user, b.value, shard, shard, b.coupon)
	}
	inserted, err := h.st.grant.Exec(ctx, tx, args)
	if err != nil {
		return false, fmt.Errorf("grant %d: %w", len(orders), err)
	}
	if inserted != n {
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT grant_new"); err != nil {
			return false, fmt.Errorf("rollback to savepoint: %w", err)
		}
		return false, nil
	}
	if err := repo.logAndIssue(ctx, gs, bx); err != nil {
		return false, err
	}
	if err := g.out.AddBatch(ctx, tx, h.grantedEvents(gs, traces)); err != nil {
		return false, err
	}
	return true, nil
}

// grantedEvents are the CouponGranted events of grants, each with the trace of its order's
// delivery. traces maps an order id to its traceparent, and is nil when the inbox does not
// trace.
func (h *handler) grantedEvents(gs []grantRow, traces map[string]string) []outbox.Event {
	events := make([]outbox.Event, len(gs))
	for j, gr := range gs {
		events[j] = h.g.grantedEvent(gr, gs[j].coupon(), traces[gr.OrderID])
	}
	return events
}

// loadOrCreateMany is loadOrCreate for many orders, sorted by order id in lock order. One
// insert creates the missing grants in INIT, and one read loads them all.
func (r sqlRepo) loadOrCreateMany(ctx context.Context, orders []OrderPaid, campaignID string, value int64) ([]grantRow, error) {
	args := make([]any, 0, len(orders)*4)
	for _, o := range orders {
		args = append(args, o.OrderID, campaignID, o.UserID, value)
	}
	if _, err := r.tx.ExecContext(ctx, r.q.d.Rebind(`INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents) VALUES `+
		groups("(?, ?, ?, 'INIT', ?)", len(orders))+r.q.createTail), args...); err != nil {
		return nil, fmt.Errorf("create %d grants: %w", len(orders), err)
	}
	keys := make([]any, 0, len(orders)+1)
	keys = append(keys, campaignID)
	for _, o := range orders {
		keys = append(keys, o.OrderID)
	}
	// On MariaDB the insert locked every row. It locked the new ones implicitly and the
	// existing ones through the duplicate-key update. So a plain read sees their current
	// state, and a locking read of the IN list would only add deadlocks with concurrent
	// batches. On PostgreSQL the insert locked only the new rows, so the read locks all of
	// them, in the order of their ids.
	rows, err := r.tx.QueryContext(ctx, r.q.d.Rebind(`SELECT order_id, user_id, state, value_cents FROM coupon_grant WHERE campaign_id = ? AND order_id IN (`+
		groups("?", len(orders))+`)`+r.q.loadManyTail), keys...)
	if err != nil {
		return nil, fmt.Errorf("load %d grants: %w", len(orders), err)
	}
	defer rows.Close()
	byOrder := make(map[string]grantRow, len(orders))
	for rows.Next() {
		gr := grantRow{CampaignID: campaignID}
		var st string
		if err := rows.Scan(&gr.OrderID, &gr.UserID, &st, &gr.ValueCents); err != nil {
			return nil, fmt.Errorf("load grants: %w", err)
		}
		if gr.State, err = parseState(st); err != nil {
			return nil, err
		}
		byOrder[gr.OrderID] = gr
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load grants: %w", err)
	}
	out := make([]grantRow, len(orders))
	for i, o := range orders {
		gr, ok := byOrder[o.OrderID]
		if !ok {
			return nil, fmt.Errorf("load grants: order %s not found after insert", o.OrderID)
		}
		out[i] = gr
	}
	return out, nil
}

// takeBatch takes n coupons of stock and value cents of budget from one shard. It starts
// at start and moves on while a shard cannot cover the whole batch. It returns the shard,
// or -1 when no shard can, and then nothing was taken.
//
// One statement takes the stock and budget of a shard, both or neither. Its join row
// matches only when both can cover the batch. That saves a round trip per batch over an
// update of each. It also saves a third update giving the stock back when the budget falls
// short. With an order, for a single new grant, takeBatch runs sqlText.takeNew. On
// PostgreSQL that statement takes nothing when the order's grant exists.
func (r sqlRepo) takeBatch(ctx context.Context, campaignID, order string, n, value int64, start, shards int) (int, error) {
	take := r.q.takeBatch
	if order != "" {
		take = r.q.takeNew
	}
	for i := range shards {
		shard := (start + i) % shards
		res, err := r.tx.ExecContext(ctx, take, r.q.takeArgs(campaignID, order, shard, n, value)...)
		if err != nil {
			return -1, fmt.Errorf("take stock and budget: %w", err)
		}
		// The MySQL family counts the rows changed in both tables. That is 2, or 1 when
		// value is 0 and the budget row is left as it was. It is 0 when the shard cannot
		// cover the batch. A positive n always changes the stock. PostgreSQL counts only the
		// budget row, 1 or 0.
		changed, err := res.RowsAffected()
		if err != nil {
			return -1, fmt.Errorf("take stock and budget: %w", err)
		}
		if changed > 0 {
			return shard, nil
		}
	}
	return -1, nil
}

// grantMany moves grants locked in INIT to GRANTED, logs their transitions and writes
// their coupons. It runs three statements for the batch.
func (r sqlRepo) grantMany(ctx context.Context, gs []grantRow) error {
	bx := boxAll(gs)
	up := make([]any, 0, len(gs)*7)
	for i, g := range gs {
		b := bx[i]
		up = append(up, b.order, b.campaign, b.user, b.value, g.StockShard, g.BudgetShard, b.coupon)
	}
	// loadOrCreateMany made every row exist and locked it in INIT in this transaction. So
	// the upsert only updates. Should a row not be in INIT, the state guard in the update
	// leaves it unchanged. The coupon insert below would then fail on its unique key and
	// roll the batch back.
	if _, err := r.tx.ExecContext(ctx, r.q.d.Rebind(`INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents, stock_shard, budget_shard, coupon_id) VALUES `+
		groups("(?, ?, ?, 'GRANTED', ?, ?, ?, ?)", len(gs))+r.q.grantManyTail), up...); err != nil {
		return fmt.Errorf("grant %d: %w", len(gs), err)
	}
	return r.logAndIssue(ctx, gs, bx)
}

// logAndIssue writes the transition log of grants that went from INIT to GRANTED, and
// their coupons. The batch commits the whole path at once, and never commits LOCKED or
// BUDGET_DEDUCTED on their own. So each grant logs the one committed transition, INIT →
// GRANTED, after checking each step against the state machine. One log row per order
// instead of three costs MariaDB much less. See docs/BENCHMARKS.md, section "End to end
// against the inbox's ceiling, and the router's CPU per order".
func (r sqlRepo) logAndIssue(ctx context.Context, gs []grantRow, bx []boxed) error {
	if err := checkPath(grantPath); err != nil {
		return err
	}
	from, to := any(string(StateInit)), any(string(StateGranted))
	logArgs := make([]any, 0, len(gs)*4)
	coupons := make([]any, 0, len(gs)*5)
	for _, b := range bx {
		logArgs = append(logArgs, b.order, b.campaign, from, to)
		coupons = append(coupons, b.coupon, b.order, b.campaign, b.user, b.value)
	}
	if _, err := r.st.log.Exec(ctx, r.tx, logArgs); err != nil {
		return fmt.Errorf("log %d transitions: %w", len(gs), err)
	}
	if _, err := r.st.coupon.Exec(ctx, r.tx, coupons); err != nil {
		return fmt.Errorf("write %d coupons: %w", len(gs), err)
	}
	return nil
}

// boxed are a grant's values as statement arguments. Each is boxed once for all of the
// batch's statements, because a string or a large integer in an interface is an
// allocation. The campaign and the value are boxed once for the whole batch.
type boxed struct{ order, user, coupon, campaign, value any }

// boxAll boxes the values of gs. It computes their coupon ids with grantRow.coupon.
func boxAll(gs []grantRow) []boxed {
	out := make([]boxed, len(gs))
	var campaign, value any
	for i := range gs {
		g := &gs[i]
		if c, ok := campaign.(string); !ok || c != g.CampaignID {
			campaign = g.CampaignID
		}
		if v, ok := value.(int64); !ok || v != g.ValueCents {
			value = g.ValueCents
		}
		out[i] = boxed{order: g.OrderID, user: g.UserID, coupon: g.coupon(), campaign: campaign, value: value}
	}
	return out
}

// checkPath checks that every step of path is a legal transition.
func checkPath(path []State) error {
	for i := 1; i < len(path); i++ {
		if err := transit(path[i-1], path[i]); err != nil {
			return err
		}
	}
	return nil
}

// groups returns n copies of group separated by commas.
func groups(group string, n int) string {
	return strings.TrimSuffix(strings.Repeat(group+", ", n), ", ")
}

package coupon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// grantRow is the adapter-side shape of a coupon_grant row.
type grantRow struct {
	OrderID     string
	CampaignID  string
	UserID      string
	State       State
	ValueCents  int64
	StockShard  int
	BudgetShard int
}

// mysqlRepo holds every SQL statement of the coupon plugin. It works on the transaction the
// inbox hands to the handler; st are HandleBatch's multi-row inserts (nil outside HandleBatch).
type mysqlRepo struct {
	tx *sql.Tx
	st *batchStatements
}

// loadOrCreate creates the grant in INIT (first delivery) or loads it (resume, duplicate).
func (r mysqlRepo) loadOrCreate(ctx context.Context, o OrderPaid, campaignID string, value int64) (grantRow, error) {
	if _, err := r.tx.ExecContext(ctx, `INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents)
 VALUES (?, ?, ?, 'INIT', ?) ON DUPLICATE KEY UPDATE order_id = order_id`, o.OrderID, campaignID, o.UserID, value); err != nil {
		return grantRow{}, fmt.Errorf("create grant: %w", err)
	}
	g := grantRow{OrderID: o.OrderID, CampaignID: campaignID}
	var st string
	var stockShard, budgetShard sql.NullInt64
	if err := r.tx.QueryRowContext(ctx, `SELECT user_id, state, value_cents, stock_shard, budget_shard FROM coupon_grant WHERE order_id = ? AND campaign_id = ?`,
		o.OrderID, campaignID).Scan(&g.UserID, &st, &g.ValueCents, &stockShard, &budgetShard); err != nil {
		return grantRow{}, fmt.Errorf("load grant: %w", err)
	}
	s, err := ParseState(st)
	if err != nil {
		return grantRow{}, err
	}
	g.State = s
	g.StockShard, g.BudgetShard = int(stockShard.Int64), int(budgetShard.Int64)
	return g, nil
}

// readState reads the committed state of a grant, outside any transaction; INIT when the
// grant does not exist yet.
func readState(ctx context.Context, db *sql.DB, orderID, campaignID string) (State, error) {
	var st string
	err := db.QueryRowContext(ctx, `SELECT state FROM coupon_grant WHERE order_id = ? AND campaign_id = ?`, orderID, campaignID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return StateInit, nil
	}
	if err != nil {
		return "", fmt.Errorf("read grant state: %w", err)
	}
	return ParseState(st)
}

// cas moves the grant from → to with an optimistic lock and logs the transition. Zero rows
// updated means another attempt got there first: ErrStaleState, and the caller's
// transaction (with this step's side effect) is rolled back.
func (r mysqlRepo) cas(ctx context.Context, g grantRow, from, to State, couponID, reason string) error {
	if err := Transit(from, to); err != nil {
		return err
	}
	res, err := r.tx.ExecContext(ctx, `UPDATE coupon_grant SET state = ?, version = version + 1,
 coupon_id = COALESCE(?, coupon_id), reason = COALESCE(?, reason)
 WHERE order_id = ? AND campaign_id = ? AND state = ?`, string(to), nullStr(couponID), nullStr(reason), g.OrderID, g.CampaignID, string(from))
	if err != nil {
		return fmt.Errorf("transition %s → %s: %w", from, to, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("transition %s → %s: %w", from, to, err)
	}
	if n != 1 {
		return fmt.Errorf("%w: order %s expected %s", ErrStaleState, g.OrderID, from)
	}
	if _, err := r.tx.ExecContext(ctx, `INSERT INTO coupon_grant_log (order_id, campaign_id, from_state, to_state) VALUES (?, ?, ?, ?)`,
		g.OrderID, g.CampaignID, string(from), string(to)); err != nil {
		return fmt.Errorf("log transition: %w", err)
	}
	return nil
}

// Counters are sharded: a campaign's stock and budget are split over shards rows, and a
// grant starts at the shard its order id hashes to, moving on only when that shard is
// exhausted. Exhaustion is therefore campaign-wide: an order fails only when every shard is
// empty. The shard used is recorded on the grant so a later release or consume touches the
// same row.

// shardOf is the first shard tried for an order.
func shardOf(orderID string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(orderID))
	return int(h.Sum32() % uint32(shards))
}

// lockStock reserves one coupon of the campaign's stock; -1 when none is left anywhere.
func (r mysqlRepo) lockStock(ctx context.Context, g grantRow, shards int) (int, error) {
	return r.takeFromShards(ctx, "lock stock", g, shards,
		`UPDATE coupon_stock SET locked = locked + 1 WHERE campaign_id = ? AND shard = ? AND locked + granted < total`,
		func(shard int) []any { return []any{g.CampaignID, shard} },
		`UPDATE coupon_grant SET stock_shard = ? WHERE order_id = ? AND campaign_id = ?`)
}

// deductBudget spends the grant's value from the campaign budget; -1 when no shard covers it.
func (r mysqlRepo) deductBudget(ctx context.Context, g grantRow, shards int) (int, error) {
	return r.takeFromShards(ctx, "deduct budget", g, shards,
		`UPDATE coupon_budget SET spent_cents = spent_cents + ? WHERE campaign_id = ? AND shard = ? AND spent_cents + ? <= total_cents`,
		func(shard int) []any { return []any{g.ValueCents, g.CampaignID, shard, g.ValueCents} },
		`UPDATE coupon_grant SET budget_shard = ? WHERE order_id = ? AND campaign_id = ?`)
}

// takeFromShards runs take on the order's shard, then the next ones, until one row
// changes; record then stores the shard on the grant. It returns -1 when no shard could.
func (r mysqlRepo) takeFromShards(ctx context.Context, what string, g grantRow, shards int, take string, args func(shard int) []any, record string) (int, error) {
	first := shardOf(g.OrderID, shards)
	for i := range shards {
		shard := (first + i) % shards
		ok, err := r.affected(ctx, what, take, args(shard)...)
		if err != nil {
			return -1, err
		}
		if ok {
			if _, err := r.tx.ExecContext(ctx, record, shard, g.OrderID, g.CampaignID); err != nil {
				return -1, fmt.Errorf("%s: record shard: %w", what, err)
			}
			return shard, nil
		}
	}
	return -1, nil
}

func (r mysqlRepo) releaseStock(ctx context.Context, g grantRow) error {
	ok, err := r.affected(ctx, "release stock", `UPDATE coupon_stock SET locked = locked - 1 WHERE campaign_id = ? AND shard = ? AND locked > 0`, g.CampaignID, g.StockShard)
	if err == nil && !ok {
		err = fmt.Errorf("release stock of %s shard %d: nothing locked", g.CampaignID, g.StockShard)
	}
	return err
}

func (r mysqlRepo) consumeStock(ctx context.Context, g grantRow) error {
	ok, err := r.affected(ctx, "consume stock", `UPDATE coupon_stock SET locked = locked - 1, granted = granted + 1 WHERE campaign_id = ? AND shard = ? AND locked > 0`, g.CampaignID, g.StockShard)
	if err == nil && !ok {
		err = fmt.Errorf("consume stock of %s shard %d: nothing locked", g.CampaignID, g.StockShard)
	}
	return err
}

func (r mysqlRepo) insertCoupon(ctx context.Context, g grantRow, couponID string) error {
	if _, err := r.tx.ExecContext(ctx, `INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES (?, ?, ?, ?, ?)`,
		couponID, g.OrderID, g.CampaignID, g.UserID, g.ValueCents); err != nil {
		return fmt.Errorf("write wallet: %w", err)
	}
	return nil
}

func (r mysqlRepo) affected(ctx context.Context, what, q string, args ...any) (bool, error) {
	res, err := r.tx.ExecContext(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return n == 1, nil
}

// EnsureCampaign creates the campaign's stock and budget shards if the campaign does not
// exist yet, splitting the totals evenly (the remainder goes to shard 0). It never changes
// an existing campaign, whatever the configured shard count: shards returns how many the
// campaign really has.
func EnsureCampaign(ctx context.Context, db *sql.DB, c Config) error {
	// Never more shards than coupons the stock or the budget can pay for, and the budget is
	// split in whole coupons, so sharding never strands a partial coupon's worth of budget:
	// the campaign grants exactly as many coupons as an unsharded one would.
	units := c.BudgetCents / c.ValueCents
	n := int(max(min(int64(max(c.Shards, 1)), c.StockTotal, units), 1))
	return dbx.InTx(ctx, db, func(tx *sql.Tx) error {
		var have int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM coupon_stock WHERE campaign_id = ?`, c.CampaignID).Scan(&have); err != nil {
			return fmt.Errorf("ensure campaign: %w", err)
		}
		if have > 0 {
			return nil
		}
		for s := range n {
			stock, budget := c.StockTotal/int64(n), units/int64(n)*c.ValueCents
			if s == 0 {
				stock += c.StockTotal % int64(n)
				budget += c.BudgetCents - units/int64(n)*c.ValueCents*int64(n)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO coupon_stock (campaign_id, shard, total) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE campaign_id = campaign_id`, c.CampaignID, s, stock); err != nil {
				return fmt.Errorf("ensure campaign stock: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO coupon_budget (campaign_id, shard, total_cents) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE campaign_id = campaign_id`, c.CampaignID, s, budget); err != nil {
				return fmt.Errorf("ensure campaign budget: %w", err)
			}
		}
		return nil
	})
}

// campaignShards returns how many counter shards the campaign has.
func (r mysqlRepo) campaignShards(ctx context.Context, campaignID string) (int, error) {
	var n int
	if err := r.tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM coupon_stock WHERE campaign_id = ?`, campaignID).Scan(&n); err != nil {
		return 0, fmt.Errorf("campaign shards: %w", err)
	}
	if n == 0 {
		return 0, fmt.Errorf("campaign %q has no stock rows (coupon.EnsureCampaign creates them)", campaignID)
	}
	return n, nil
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

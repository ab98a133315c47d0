package coupon

import (
	"context"
	"database/sql"
	"fmt"
)

// grantRow is the adapter-side shape of a coupon_grant row.
type grantRow struct {
	OrderID    string
	CampaignID string
	UserID     string
	State      State
	ValueCents int64
}

// mysqlRepo holds every SQL statement of the coupon plugin. It works on the transaction the
// inbox hands to the handler.
type mysqlRepo struct{ tx *sql.Tx }

// loadOrCreate creates the grant in INIT (first delivery) or loads it (resume, duplicate).
func (r mysqlRepo) loadOrCreate(ctx context.Context, o OrderPaid, campaignID string, value int64) (grantRow, error) {
	if _, err := r.tx.ExecContext(ctx, `INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents)
 VALUES (?, ?, ?, 'INIT', ?) ON DUPLICATE KEY UPDATE order_id = order_id`, o.OrderID, campaignID, o.UserID, value); err != nil {
		return grantRow{}, fmt.Errorf("create grant: %w", err)
	}
	g := grantRow{OrderID: o.OrderID, CampaignID: campaignID}
	var st string
	if err := r.tx.QueryRowContext(ctx, `SELECT user_id, state, value_cents FROM coupon_grant WHERE order_id = ? AND campaign_id = ?`,
		o.OrderID, campaignID).Scan(&g.UserID, &st, &g.ValueCents); err != nil {
		return grantRow{}, fmt.Errorf("load grant: %w", err)
	}
	s, err := ParseState(st)
	if err != nil {
		return grantRow{}, err
	}
	g.State = s
	return g, nil
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

// lockStock reserves one coupon of the campaign's stock; false when none is left.
func (r mysqlRepo) lockStock(ctx context.Context, campaignID string) (bool, error) {
	return r.affected(ctx, "lock stock", `UPDATE coupon_stock SET locked = locked + 1 WHERE campaign_id = ? AND locked + granted < total`, campaignID)
}

func (r mysqlRepo) releaseStock(ctx context.Context, campaignID string) error {
	ok, err := r.affected(ctx, "release stock", `UPDATE coupon_stock SET locked = locked - 1 WHERE campaign_id = ? AND locked > 0`, campaignID)
	if err == nil && !ok {
		err = fmt.Errorf("release stock of %s: nothing locked", campaignID)
	}
	return err
}

func (r mysqlRepo) consumeStock(ctx context.Context, campaignID string) error {
	ok, err := r.affected(ctx, "consume stock", `UPDATE coupon_stock SET locked = locked - 1, granted = granted + 1 WHERE campaign_id = ? AND locked > 0`, campaignID)
	if err == nil && !ok {
		err = fmt.Errorf("consume stock of %s: nothing locked", campaignID)
	}
	return err
}

// deductBudget spends value from the campaign budget; false when it does not cover it.
func (r mysqlRepo) deductBudget(ctx context.Context, campaignID string, value int64) (bool, error) {
	return r.affected(ctx, "deduct budget", `UPDATE coupon_budget SET spent_cents = spent_cents + ? WHERE campaign_id = ? AND spent_cents + ? <= total_cents`, value, campaignID, value)
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

// EnsureCampaign creates the campaign's stock and budget rows if they do not exist; it
// never changes existing counters.
func EnsureCampaign(ctx context.Context, db *sql.DB, c Config) error {
	if _, err := db.ExecContext(ctx, `INSERT INTO coupon_stock (campaign_id, total) VALUES (?, ?) ON DUPLICATE KEY UPDATE campaign_id = campaign_id`, c.CampaignID, c.StockTotal); err != nil {
		return fmt.Errorf("ensure campaign stock: %w", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO coupon_budget (campaign_id, total_cents) VALUES (?, ?) ON DUPLICATE KEY UPDATE campaign_id = campaign_id`, c.CampaignID, c.BudgetCents); err != nil {
		return fmt.Errorf("ensure campaign budget: %w", err)
	}
	return nil
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

package coupon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

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
	couponID    string // the CouponID, once coupon computed it
}

// coupon is the grant's coupon id. CouponID hashes, so coupon computes the id once.
func (g *grantRow) coupon() string {
	if g.couponID == "" {
		g.couponID = CouponID(g.OrderID, g.CampaignID)
	}
	return g.couponID
}

// sqlRepo holds every SQL statement of the coupon plugin. It works on the transaction the
// inbox hands to the handler, with the statements q of its database. st holds HandleBatch's
// multi-row inserts, and is nil outside HandleBatch.
type sqlRepo struct {
	tx *sql.Tx
	q  *sqlText
	st *batchStatements
}

// sqlText is the plugin's SQL in one dialect, with its placeholders rebound once. The MySQL
// family's SQL serves MariaDB and MySQL 8 alike, because nothing here is MariaDB-only. It
// differs from PostgreSQL's in the upserts and in the statements that update stock and
// budget together. The MySQL family updates both with a join. PostgreSQL takes a locking
// read and runs two updates in one statement.
type sqlText struct {
	d dbx.Dialect

	createGrant, loadGrant, readState, cas, logTransition            string
	lockStock, recordStock, deductBudget, recordBudget               string
	releaseStock, consumeStock, insertCoupon, shards                 string
	ensureStock, ensureBudget, takeBatch, takeNew, giveBack, history string
	createTail, loadManyTail, grantManyTail, batchGrantTail          string // tails of the batch's statements
}

var (
	mysqlText = newSQLText(dbx.MariaDB)
	pgText    = newSQLText(dbx.Postgres)
)

// textFor is the plugin's SQL for dialect d.
func textFor(d dbx.Dialect) *sqlText {
	if d.IsPostgres() {
		return pgText
	}
	return mysqlText
}

func newSQLText(d dbx.Dialect) *sqlText {
	q := &sqlText{d: d,
		createGrant: `INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents) VALUES (?, ?, ?, 'INIT', ?)`,
		loadGrant:   `SELECT user_id, state, value_cents, stock_shard, budget_shard FROM coupon_grant WHERE order_id = ? AND campaign_id = ?`,
		readState:   `SELECT state FROM coupon_grant WHERE order_id = ? AND campaign_id = ?`,
		cas: `UPDATE coupon_grant SET state = ?, version = version + 1,
 coupon_id = COALESCE(?, coupon_id), reason = COALESCE(?, reason)
 WHERE order_id = ? AND campaign_id = ? AND state = ?`,
		logTransition: `INSERT INTO coupon_grant_log (order_id, campaign_id, from_state, to_state) VALUES (?, ?, ?, ?)`,
		lockStock:     `UPDATE coupon_stock SET locked = locked + 1 WHERE campaign_id = ? AND shard = ? AND locked + granted < total`,
		recordStock:   `UPDATE coupon_grant SET stock_shard = ? WHERE order_id = ? AND campaign_id = ?`,
		deductBudget:  `UPDATE coupon_budget SET spent_cents = spent_cents + ? WHERE campaign_id = ? AND shard = ? AND spent_cents + ? <= total_cents`,
		recordBudget:  `UPDATE coupon_grant SET budget_shard = ? WHERE order_id = ? AND campaign_id = ?`,
		releaseStock:  `UPDATE coupon_stock SET locked = locked - 1 WHERE campaign_id = ? AND shard = ? AND locked > 0`,
		consumeStock:  `UPDATE coupon_stock SET locked = locked - 1, granted = granted + 1 WHERE campaign_id = ? AND shard = ? AND locked > 0`,
		insertCoupon:  `INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES (?, ?, ?, ?, ?)`,
		shards:        `SELECT COUNT(*) FROM coupon_stock WHERE campaign_id = ?`,
		ensureStock:   `INSERT INTO coupon_stock (campaign_id, shard, total) VALUES (?, ?, ?)`,
		ensureBudget:  `INSERT INTO coupon_budget (campaign_id, shard, total_cents) VALUES (?, ?, ?)`,
		history: `SELECT l.created_at, l.from_state, l.to_state, l.campaign_id, g.coupon_id, g.reason
 FROM coupon_grant_log l LEFT JOIN coupon_grant g ON g.order_id = l.order_id AND g.campaign_id = l.campaign_id
 WHERE l.order_id = ? ORDER BY l.id LIMIT ?`,
	}
	if d.IsPostgres() {
		// The insert of a grant that exists does nothing and locks nothing. The read that
		// follows takes the row lock that MariaDB's duplicate-key update takes. So the steps
		// of one order run one after another on both databases.
		q.createGrant += ` ON CONFLICT (order_id, campaign_id) DO NOTHING`
		q.loadGrant += ` FOR UPDATE`
		q.ensureStock += ` ON CONFLICT (campaign_id, shard) DO NOTHING`
		q.ensureBudget += ` ON CONFLICT (campaign_id, shard) DO NOTHING`
		q.createTail = ` ON CONFLICT (order_id, campaign_id) DO NOTHING`
		q.loadManyTail = ` ORDER BY order_id FOR UPDATE`
		q.batchGrantTail = ` ON CONFLICT (order_id, campaign_id) DO NOTHING`
		q.grantManyTail = ` ON CONFLICT (order_id, campaign_id) DO UPDATE SET
 version = coupon_grant.version + 3, stock_shard = EXCLUDED.stock_shard, budget_shard = EXCLUDED.budget_shard,
 coupon_id = EXCLUDED.coupon_id, state = EXCLUDED.state
 WHERE coupon_grant.state = 'INIT'`
		// The statement takes the stock and budget of a shard, both or neither. Its locking
		// read takes both rows when both can cover n coupons of value cents. PostgreSQL
		// checks that again on the rows' latest versions. Then each row is updated. The
		// parameters are $1 n, $2 value, $3 campaign and $4 shard, in the order of MySQL's
		// statement. takeNew adds $5, the order, whose grant must not exist. When it does,
		// takeNew takes nothing, because an insert failing on the grant would abort the
		// transaction.
		take := `WITH s AS (SELECT s.campaign_id, s.shard FROM coupon_stock s JOIN coupon_budget b ON b.campaign_id = s.campaign_id AND b.shard = s.shard
 WHERE s.campaign_id = $3 AND s.shard = $4 AND s.locked + s.granted + $1 <= s.total AND b.spent_cents + $2 <= b.total_cents%s FOR UPDATE),
 t AS (UPDATE coupon_stock x SET granted = x.granted + $1 FROM s WHERE x.campaign_id = s.campaign_id AND x.shard = s.shard)
UPDATE coupon_budget y SET spent_cents = y.spent_cents + $2 FROM s WHERE y.campaign_id = s.campaign_id AND y.shard = s.shard`
		q.takeBatch = fmt.Sprintf(take, "")
		q.takeNew = fmt.Sprintf(take, `
 AND NOT EXISTS (SELECT 1 FROM coupon_grant g WHERE g.order_id = $5 AND g.campaign_id = $3)`)
	} else {
		q.createGrant += ` ON DUPLICATE KEY UPDATE order_id = order_id`
		q.ensureStock += ` ON DUPLICATE KEY UPDATE campaign_id = campaign_id`
		q.ensureBudget += ` ON DUPLICATE KEY UPDATE campaign_id = campaign_id`
		q.createTail = ` ON DUPLICATE KEY UPDATE order_id = order_id`
		q.batchGrantTail = ` ON DUPLICATE KEY UPDATE order_id = order_id`
		q.grantManyTail = ` ON DUPLICATE KEY UPDATE
 version = IF(state = 'INIT', version + 3, version),
 stock_shard = IF(state = 'INIT', VALUES(stock_shard), stock_shard),
 budget_shard = IF(state = 'INIT', VALUES(budget_shard), budget_shard),
 coupon_id = IF(state = 'INIT', VALUES(coupon_id), coupon_id),
 state = IF(state = 'INIT', 'GRANTED', state)`
		q.takeBatch = `UPDATE coupon_stock s JOIN coupon_budget b ON b.campaign_id = s.campaign_id AND b.shard = s.shard
 SET s.granted = s.granted + ?, b.spent_cents = b.spent_cents + ?
 WHERE s.campaign_id = ? AND s.shard = ? AND s.locked + s.granted + ? <= s.total AND b.spent_cents + ? <= b.total_cents`
		q.takeNew = q.takeBatch
		q.giveBack = `UPDATE coupon_stock s JOIN coupon_budget b ON b.campaign_id = s.campaign_id AND b.shard = s.shard
 SET s.granted = s.granted - 1, b.spent_cents = b.spent_cents - ? WHERE s.campaign_id = ? AND s.shard = ?`
	}
	for _, p := range []*string{&q.createGrant, &q.loadGrant, &q.readState, &q.cas, &q.logTransition, &q.lockStock, &q.recordStock,
		&q.deductBudget, &q.recordBudget, &q.releaseStock, &q.consumeStock, &q.insertCoupon, &q.shards, &q.ensureStock, &q.ensureBudget, &q.history} {
		*p = d.Rebind(*p)
	}
	return q
}

// takeArgs are the parameters of takeNew, or of takeBatch when orderID is empty.
func (q *sqlText) takeArgs(campaignID, orderID string, shard int, n, value int64) []any {
	if q.d.IsPostgres() {
		if orderID != "" {
			return []any{n, value, campaignID, shard, orderID}
		}
		return []any{n, value, campaignID, shard}
	}
	return []any{n, value, campaignID, shard, n, value}
}

// textOf is the plugin's SQL for the database tx belongs to, PostgreSQL or the MySQL
// family. A granter built without a pool, by NewGranter, asks the server once.
func (g *Granter) textOf(ctx context.Context, tx *sql.Tx) (*sqlText, error) {
	if q := g.q.Load(); q != nil {
		return q, nil
	}
	var v string
	if err := tx.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return nil, fmt.Errorf("coupon: database version: %w", err)
	}
	q := mysqlText
	if strings.HasPrefix(v, "PostgreSQL") {
		q = pgText
	}
	g.q.Store(q)
	return q, nil
}

// loadOrCreate creates the grant in INIT on its first delivery. A resumed or duplicate
// delivery loads it.
func (r sqlRepo) loadOrCreate(ctx context.Context, o OrderPaid, campaignID string, value int64) (grantRow, error) {
	if _, err := r.tx.ExecContext(ctx, r.q.createGrant, o.OrderID, campaignID, o.UserID, value); err != nil {
		return grantRow{}, fmt.Errorf("create grant: %w", err)
	}
	g := grantRow{OrderID: o.OrderID, CampaignID: campaignID}
	var st string
	var stockShard, budgetShard sql.NullInt64
	if err := r.tx.QueryRowContext(ctx, r.q.loadGrant, o.OrderID, campaignID).Scan(&g.UserID, &st, &g.ValueCents, &stockShard, &budgetShard); err != nil {
		return grantRow{}, fmt.Errorf("load grant: %w", err)
	}
	s, err := parseState(st)
	if err != nil {
		return grantRow{}, err
	}
	g.State = s
	g.StockShard, g.BudgetShard = int(stockShard.Int64), int(budgetShard.Int64)
	return g, nil
}

// readState reads the committed state of a grant, outside any transaction. It returns INIT
// when the grant does not exist yet.
func readState(ctx context.Context, db *sql.DB, orderID, campaignID string) (State, error) {
	var st string
	err := db.QueryRowContext(ctx, textFor(dbx.DialectOf(db)).readState, orderID, campaignID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return StateInit, nil
	}
	if err != nil {
		return "", fmt.Errorf("read grant state: %w", err)
	}
	return parseState(st)
}

// cas moves the grant from one state to another with an optimistic lock and logs the
// transition. When it updates no row, another attempt got there first. cas then returns
// errStaleState, and the caller's transaction is rolled back with this step's side effect.
func (r sqlRepo) cas(ctx context.Context, g grantRow, from, to State, couponID, reason string) error {
	if err := transit(from, to); err != nil {
		return err
	}
	res, err := r.tx.ExecContext(ctx, r.q.cas, string(to), nullStr(couponID), nullStr(reason), g.OrderID, g.CampaignID, string(from))
	if err != nil {
		return fmt.Errorf("transition %s → %s: %w", from, to, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("transition %s → %s: %w", from, to, err)
	}
	if n != 1 {
		return fmt.Errorf("%w: order %s expected %s", errStaleState, g.OrderID, from)
	}
	if _, err := r.tx.ExecContext(ctx, r.q.logTransition, g.OrderID, g.CampaignID, string(from), string(to)); err != nil {
		return fmt.Errorf("log transition: %w", err)
	}
	return nil
}

// Counters are sharded. A campaign's stock and budget are split over shards rows. A grant
// starts at the shard its order id hashes to, and moves on only when that shard is
// exhausted. So exhaustion is campaign-wide, and an order fails only when every shard is
// empty. The shard used is recorded on the grant, so a later release or consume touches the
// same row.

// shardOf is the first shard tried for an order.
func shardOf(orderID string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(orderID))
	return int(h.Sum32() % uint32(shards))
}

// lockStock reserves one coupon of the campaign's stock. It returns -1 when none is left
// anywhere.
func (r sqlRepo) lockStock(ctx context.Context, g grantRow, shards int) (int, error) {
	return r.takeFromShards(ctx, "lock stock", g, shards,
		r.q.lockStock, func(shard int) []any { return []any{g.CampaignID, shard} }, r.q.recordStock)
}

// deductBudget spends the grant's value from the campaign budget. It returns -1 when no
// shard covers it.
func (r sqlRepo) deductBudget(ctx context.Context, g grantRow, shards int) (int, error) {
	return r.takeFromShards(ctx, "deduct budget", g, shards,
		r.q.deductBudget, func(shard int) []any { return []any{g.ValueCents, g.CampaignID, shard, g.ValueCents} }, r.q.recordBudget)
}

// takeFromShards runs take on the order's shard, then on the next ones, until one row
// changes. record then stores the shard on the grant. takeFromShards returns -1 when no
// shard could.
func (r sqlRepo) takeFromShards(ctx context.Context, what string, g grantRow, shards int, take string, args func(shard int) []any, record string) (int, error) {
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

func (r sqlRepo) releaseStock(ctx context.Context, g grantRow) error {
	ok, err := r.affected(ctx, "release stock", r.q.releaseStock, g.CampaignID, g.StockShard)
	if err == nil && !ok {
		err = fmt.Errorf("release stock of %s shard %d: nothing locked", g.CampaignID, g.StockShard)
	}
	return err
}

func (r sqlRepo) consumeStock(ctx context.Context, g grantRow) error {
	ok, err := r.affected(ctx, "consume stock", r.q.consumeStock, g.CampaignID, g.StockShard)
	if err == nil && !ok {
		err = fmt.Errorf("consume stock of %s shard %d: nothing locked", g.CampaignID, g.StockShard)
	}
	return err
}

func (r sqlRepo) insertCoupon(ctx context.Context, g grantRow, couponID string) error {
	if _, err := r.tx.ExecContext(ctx, r.q.insertCoupon, couponID, g.OrderID, g.CampaignID, g.UserID, g.ValueCents); err != nil {
		return fmt.Errorf("write wallet: %w", err)
	}
	return nil
}

func (r sqlRepo) affected(ctx context.Context, what, q string, args ...any) (bool, error) {
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
// exist yet. It splits the totals evenly, and the remainder goes to shard 0. It never
// changes an existing campaign, whatever the configured shard count. campaignShards counts
// the shards a campaign really has.
func EnsureCampaign(ctx context.Context, db *sql.DB, c Config) error {
	// There are never more shards than coupons the stock or the budget can pay for. The
	// budget is split in whole coupons, so sharding never strands a partial coupon's worth
	// of budget. The campaign grants exactly as many coupons as an unsharded one would.
	units := c.BudgetCents / c.ValueCents
	n := int(max(min(int64(max(c.Shards, 1)), c.StockTotal, units), 1))
	q := textFor(dbx.DialectOf(db))
	return dbx.InTx(ctx, db, func(tx *sql.Tx) error {
		var have int
		if err := tx.QueryRowContext(ctx, q.shards, c.CampaignID).Scan(&have); err != nil {
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
			if _, err := tx.ExecContext(ctx, q.ensureStock, c.CampaignID, s, stock); err != nil {
				return fmt.Errorf("ensure campaign stock: %w", err)
			}
			if _, err := tx.ExecContext(ctx, q.ensureBudget, c.CampaignID, s, budget); err != nil {
				return fmt.Errorf("ensure campaign budget: %w", err)
			}
		}
		return nil
	})
}

// campaignShards returns how many counter shards the campaign has.
func (r sqlRepo) campaignShards(ctx context.Context, campaignID string) (int, error) {
	var n int
	if err := r.tx.QueryRowContext(ctx, r.q.shards, campaignID).Scan(&n); err != nil {
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

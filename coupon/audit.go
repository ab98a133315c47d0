package coupon

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Audit is the result of Verify.
type Audit struct {
	Grants            int64 // grants of the campaign, any state
	Granted           int64
	Failed            int64
	InFlight          int64 // non-terminal grants
	Coupons           int64 // user_coupon rows of the campaign
	DuplicateCoupons  int64 // coupons beyond the first per order and campaign
	InboxDone         int64
	InboxFailed       int64
	InboxProcessing   int64
	DuplicatesBlocked int64 // sum of the inbox's duplicate counters, deliveries that changed nothing
	OutboxEvents      int64 // events in the outbox, parked ones not counted
	OutboxPending     int64
	Violations        []string
}

// OK reports whether no invariant is violated.
func (a Audit) OK() bool { return len(a.Violations) == 0 }

// reasonResolved is the reason of an inbox row an operator resolved with `router inbox
// resolve`, engine.ReasonResolved: the row is done and needs no grant. The audit reads the
// inbox table with its own SQL, as it reads 'done' and 'failed'. A test holds the two
// equal.
const reasonResolved = "resolved"

// Verify audits these invariants for one campaign.
//
//  1. There is at most one user_coupon per order and campaign. Every GRANTED grant has
//     exactly one, and no coupon exists without a GRANTED grant.
//  2. Every done inbox row of biz type coupon or coupon-claim has a terminal grant of its
//     own. An order's grant id is GrantID of its key, and an HTTP claim's is ClaimID of
//     its client token. Every terminal grant has its outbox event. A row an operator
//     resolved, with reason "resolved", needs no grant.
//  3. The stock and budget counters equal the sums the grants imply.
//  4. No outbox row older than lagBound is unpublished.
//
// Verify uses its own SQL, not the handler's code paths.
func Verify(ctx context.Context, db *sql.DB, campaignID string, lagBound time.Duration) (Audit, error) {
	a, err := verifyCampaign(ctx, db, campaignID)
	if err != nil {
		return a, err
	}
	// 4. relay lag
	var stale int64
	if err := db.QueryRowContext(ctx, dbx.DialectOf(db).Rebind(`SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND created_at < ?`),
		time.Now().Add(-lagBound).UTC()).Scan(&stale); err != nil {
		return a, fmt.Errorf("verify relay lag: %w", err)
	}
	if stale > 0 {
		a.Violations = append(a.Violations, fmt.Sprintf("invariant 4: %d outbox rows unpublished for longer than %s", stale, lagBound))
	}
	return a, nil
}

// verifyCampaign is Verify without invariant 4. That invariant is about the outbox as a
// whole, so `router verify` checks it once for every plugin.
func verifyCampaign(ctx context.Context, db *sql.DB, campaignID string) (Audit, error) {
	var a Audit
	rb := dbx.DialectOf(db).Rebind
	counts := []struct {
		dst *int64
		q   string
		arg []any
	}{
		{&a.Grants, `SELECT COUNT(*) FROM coupon_grant WHERE campaign_id = ?`, []any{campaignID}},
		{&a.Granted, `SELECT COUNT(*) FROM coupon_grant WHERE campaign_id = ? AND state = 'GRANTED'`, []any{campaignID}},
		{&a.Failed, `SELECT COUNT(*) FROM coupon_grant WHERE campaign_id = ? AND state = 'FAILED'`, []any{campaignID}},
		{&a.Coupons, `SELECT COUNT(*) FROM user_coupon WHERE campaign_id = ?`, []any{campaignID}},
		{&a.DuplicateCoupons, `SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) AS n FROM user_coupon WHERE campaign_id = ? GROUP BY order_id HAVING COUNT(*) > 1) d`, []any{campaignID}},
		{&a.InboxDone, `SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND status = 'done'`, []any{BizType}},
		{&a.InboxFailed, `SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND status = 'failed' AND COALESCE(reason, '') <> 'delayed'`, []any{BizType}},
		{&a.InboxProcessing, `SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND status = 'processing'`, []any{BizType}},
		{&a.DuplicatesBlocked, `SELECT COALESCE(SUM(duplicates), 0) FROM inbox WHERE biz_type = ?`, []any{BizType}},
		{&a.OutboxEvents, `SELECT COUNT(*) FROM outbox WHERE event_type IN (?, ?)`, []any{EventGranted, EventGrantFailed}},
		{&a.OutboxPending, `SELECT COUNT(*) FROM outbox WHERE published_at IS NULL`, nil},
	}
	for _, c := range counts {
		if err := db.QueryRowContext(ctx, rb(c.q), c.arg...).Scan(c.dst); err != nil {
			return a, fmt.Errorf("verify: %w", err)
		}
	}
	a.InFlight = a.Grants - a.Granted - a.Failed
	v := func(format string, args ...any) { a.Violations = append(a.Violations, fmt.Sprintf(format, args...)) }

	// 1. coupons
	if a.DuplicateCoupons > 0 {
		v("invariant 1: %d duplicate coupons (more than one user_coupon per order)", a.DuplicateCoupons)
	}
	if err := listInto(ctx, db, &a, "invariant 1: GRANTED grant without exactly one coupon: order %s", `
SELECT g.order_id FROM coupon_grant g LEFT JOIN user_coupon c ON c.order_id = g.order_id AND c.campaign_id = g.campaign_id
WHERE g.campaign_id = ? AND g.state = 'GRANTED' GROUP BY g.order_id HAVING COUNT(c.id) <> 1 LIMIT 20`, campaignID); err != nil {
		return a, err
	}
	if err := listInto(ctx, db, &a, "invariant 1: coupon without a GRANTED grant: order %s", `
SELECT c.order_id FROM user_coupon c LEFT JOIN coupon_grant g ON g.order_id = c.order_id AND g.campaign_id = c.campaign_id
WHERE c.campaign_id = ? AND (g.state IS NULL OR g.state <> 'GRANTED') LIMIT 20`, campaignID); err != nil {
		return a, err
	}
	// 2. A done inbox row has a terminal grant, which has an outbox event. An order's grant
	// is its key, unless the key is in the claim namespace. Those orders and the claims are
	// checked apart.
	if err := listInto(ctx, db, &a, "invariant 2: inbox row done but grant not terminal: order %s", `
SELECT i.dedup_key FROM inbox i LEFT JOIN coupon_grant g ON g.order_id = i.dedup_key AND g.campaign_id = ?
WHERE i.biz_type = ? AND i.status = 'done' AND COALESCE(i.reason, '') <> ? AND i.dedup_key NOT LIKE ?
  AND (g.state IS NULL OR g.state NOT IN ('GRANTED', 'FAILED')) LIMIT 20`, campaignID, BizType, reasonResolved, claimPrefix+"%"); err != nil {
		return a, err
	}
	if err := listUngranted(ctx, db, &a, campaignID, "order", `SELECT id, dedup_key, '' FROM inbox
WHERE biz_type = ? AND status = 'done' AND COALESCE(reason, '') <> ? AND dedup_key LIKE ?`,
		[]any{BizType, reasonResolved, claimPrefix + "%"}, func(key, _ string) string { return GrantID(key) }); err != nil {
		return a, err
	}
	if err := listUngranted(ctx, db, &a, campaignID, "claim", `SELECT id, dedup_key, COALESCE(metadata, '') FROM inbox
WHERE biz_type = ? AND status = 'done' AND COALESCE(reason, '') <> ?`,
		[]any{ClaimBizType, reasonResolved}, claimOfRow); err != nil {
		return a, err
	}
	// The check groups over the tables instead of joining them. The outbox has no index on
	// msg_key, because every index costs each business transaction an insert. Without one,
	// MariaDB joins the outbox block by block, in time quadratic in the rows. An event the
	// relay parked in outbox_parked is still the grant's event. Kafka refused such an
	// event, or it waits behind one that was refused.
	if err := listInto(ctx, db, &a, "invariant 2: terminal grant without exactly one outbox event: order %s", `
SELECT k FROM (
  SELECT order_id AS k, CASE WHEN state = 'GRANTED' THEN ? ELSE ? END AS t, 1 AS g, 0 AS o FROM coupon_grant WHERE campaign_id = ? AND state IN ('GRANTED', 'FAILED')
  UNION ALL
  SELECT msg_key, event_type, 0, 1 FROM outbox WHERE event_type IN (?, ?)
  UNION ALL
  SELECT msg_key, event_type, 0, 1 FROM outbox_parked WHERE event_type IN (?, ?)
) x GROUP BY k, t HAVING SUM(g) = 1 AND SUM(o) <> 1 LIMIT 20`,
		EventGranted, EventGrantFailed, campaignID, EventGranted, EventGrantFailed, EventGranted, EventGrantFailed); err != nil {
		return a, err
	}
	// 3. counters, per shard and in total
	if err := listInto(ctx, db, &a, "invariant 3: %s", `
SELECT CONCAT('shard ', s.shard, ': stock.locked=', s.locked, ' granted=', s.granted, ' budget.spent=', COALESCE(b.spent_cents, 0),
  '; grants imply locked=', COALESCE(gs.locked, 0), ' granted=', COALESCE(gs.granted, 0), ' spent=', COALESCE(gb.spent, 0))
FROM coupon_stock s
LEFT JOIN coupon_budget b ON b.campaign_id = s.campaign_id AND b.shard = s.shard
LEFT JOIN (SELECT stock_shard, SUM(CASE WHEN state IN ('LOCKED', 'BUDGET_DEDUCTED') THEN 1 ELSE 0 END) AS locked,
                  SUM(CASE WHEN state = 'GRANTED' THEN 1 ELSE 0 END) AS granted
           FROM coupon_grant WHERE campaign_id = ? AND stock_shard IS NOT NULL GROUP BY stock_shard) gs ON gs.stock_shard = s.shard
LEFT JOIN (SELECT budget_shard, SUM(CASE WHEN state IN ('BUDGET_DEDUCTED', 'GRANTED') THEN value_cents ELSE 0 END) AS spent
           FROM coupon_grant WHERE campaign_id = ? AND budget_shard IS NOT NULL GROUP BY budget_shard) gb ON gb.budget_shard = s.shard
WHERE s.campaign_id = ?
  AND (s.locked <> COALESCE(gs.locked, 0) OR s.granted <> COALESCE(gs.granted, 0) OR COALESCE(b.spent_cents, 0) <> COALESCE(gb.spent, 0))
LIMIT 20`, campaignID, campaignID, campaignID); err != nil {
		return a, err
	}
	var locked, granted, spent, lockedWant, grantedWant, spentWant sql.NullInt64
	if err := db.QueryRowContext(ctx, rb(`SELECT (SELECT SUM(locked) FROM coupon_stock WHERE campaign_id = ?), (SELECT SUM(granted) FROM coupon_stock WHERE campaign_id = ?),
 (SELECT SUM(spent_cents) FROM coupon_budget WHERE campaign_id = ?)`), campaignID, campaignID, campaignID).Scan(&locked, &granted, &spent); err != nil {
		return a, fmt.Errorf("verify counters: %w", err)
	}
	if err := db.QueryRowContext(ctx, rb(`SELECT
 COALESCE(SUM(CASE WHEN state IN ('LOCKED', 'BUDGET_DEDUCTED') THEN 1 ELSE 0 END), 0), COALESCE(SUM(CASE WHEN state = 'GRANTED' THEN 1 ELSE 0 END), 0),
 COALESCE(SUM(CASE WHEN state IN ('BUDGET_DEDUCTED', 'GRANTED') THEN value_cents ELSE 0 END), 0)
 FROM coupon_grant WHERE campaign_id = ?`), campaignID).Scan(&lockedWant, &grantedWant, &spentWant); err != nil {
		return a, fmt.Errorf("verify counters: %w", err)
	}
	if locked.Int64 != lockedWant.Int64 || granted.Int64 != grantedWant.Int64 || spent.Int64 != spentWant.Int64 {
		v("invariant 3: counters stock.locked=%d granted=%d budget.spent=%d, grants imply locked=%d granted=%d spent=%d",
			locked.Int64, granted.Int64, spent.Int64, lockedWant.Int64, grantedWant.Int64, spentWant.Int64)
	}
	return a, nil
}

// claimOfRow is the grant id of a done claim row. It is ClaimID of the client token that
// the row's stored headers hold. The dedup key is the token itself, unless the token was
// too long or began with "sha256:", as inbox.Command describes. For headers without the
// token, claimOfRow falls back to the key.
func claimOfRow(key, metadata string) string {
	var md map[string]string
	if metadata != "" && json.Unmarshal([]byte(metadata), &md) == nil {
		if token, ok := md[inbox.MetadataIdempotencyKey]; ok {
			return ClaimID(token)
		}
	}
	return ClaimID(key)
}

// maxListed bounds the violations one check lists.
const maxListed = 20

// listUngranted adds a violation of invariant 2 for each done inbox row that q selects
// and whose grant is not terminal in the campaign. q selects the id, the dedup key and the
// stored headers. grantOf gives the grant id of a key and its headers. listUngranted
// checks the rows whose grant id is not their key, which a join cannot check. It reads the
// rows as one stream and looks their grants up 500 at a time.
func listUngranted(ctx context.Context, db *sql.DB, a *Audit, campaignID, kind, q string, args []any, grantOf func(key, metadata string) string) error {
	rb := dbx.DialectOf(db).Rebind
	rows, err := db.QueryContext(ctx, rb(q), args...)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer rows.Close()
	type row struct {
		id  int64
		key string
	}
	pending := map[string][]row{} // grant id to the rows whose grant it is
	listed := 0
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		ids := make([]any, 0, len(pending)+1)
		ids = append(ids, campaignID)
		for id := range pending {
			ids = append(ids, id)
		}
		terminal := map[string]bool{}
		if err := scanPairs(ctx, db, `SELECT order_id, state FROM coupon_grant WHERE campaign_id = ? AND state IN ('GRANTED', 'FAILED') AND order_id IN (?`+
			strings.Repeat(", ?", len(pending)-1)+`)`, ids, func(k, _ string) { terminal[k] = true }); err != nil {
			return err
		}
		for id, rs := range pending {
			for _, r := range rs {
				if !terminal[id] && listed < maxListed {
					listed++
					a.Violations = append(a.Violations, fmt.Sprintf("invariant 2: inbox row done but grant not terminal: %s %s (inbox row %d, grant %s)", kind, r.key, r.id, id))
				}
			}
		}
		clear(pending)
		return nil
	}
	for rows.Next() {
		var r row
		var metadata string
		if err := rows.Scan(&r.id, &r.key, &metadata); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		id := grantOf(r.key, metadata)
		pending[id] = append(pending[id], r)
		if len(pending) >= 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return flush()
}

func listInto(ctx context.Context, db *sql.DB, a *Audit, format, q string, args ...any) error {
	rows, err := db.QueryContext(ctx, dbx.DialectOf(db).Rebind(q), args...)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		a.Violations = append(a.Violations, fmt.Sprintf(format, s))
	}
	return rows.Err()
}

// orderFacts is what the database says about a list of orders, such as a producer's
// ledger.
type orderFacts struct {
	Terminal, Granted, Quarantined int // orders with a terminal grant, GRANTED ones, quarantined in the inbox
	Resolved                       int // orders without a terminal grant whose quarantined row an operator resolved
	Coupons, DuplicateCoupons      int // user_coupon rows of the orders, and beyond the first per order
	Duplicates                     int // deliveries of the orders blocked as duplicates
	Lost                           int // orders with neither a terminal grant nor a quarantine record
	LostIDs                        []string
}

// ledgerFacts checks every order of the campaign, in chunks. Each order's grant is
// GrantID of its id.
func ledgerFacts(ctx context.Context, db *sql.DB, campaign string, orders []string) (orderFacts, error) {
	var f orderFacts
	for start := 0; start < len(orders); start += 500 {
		chunk := orders[start:min(start+500, len(orders))]
		in := strings.TrimSuffix(strings.Repeat("?,", len(chunk)), ",")
		args := make([]any, 0, len(chunk)+1)
		args = append(args, campaign)
		for _, id := range chunk {
			args = append(args, GrantID(id))
		}
		states := map[string]string{}
		if err := scanPairs(ctx, db, `SELECT order_id, state FROM coupon_grant WHERE campaign_id = ? AND order_id IN (`+in+`)`, args, func(k, v string) { states[k] = v }); err != nil {
			return f, err
		}
		coupons := map[string]int{}
		if err := scanPairs(ctx, db, `SELECT order_id, COUNT(*) FROM user_coupon WHERE campaign_id = ? AND order_id IN (`+in+`) GROUP BY order_id`, args, func(k, v string) {
			var n int
			fmt.Sscan(v, &n)
			coupons[k] = n
		}); err != nil {
			return f, err
		}
		args[0] = BizType
		for i, id := range chunk {
			args[i+1] = id
		}
		inboxStatus := map[string]string{}
		if err := scanPairs(ctx, db, `SELECT dedup_key, CONCAT(status, ' ', duplicates, ' ', COALESCE(reason, '-')) FROM inbox WHERE biz_type = ? AND dedup_key IN (`+in+`)`, args, func(k, v string) {
			var st, reason string
			var d int
			fmt.Sscan(v, &st, &d, &reason)
			if reason == reasonResolved {
				st = reason
			}
			inboxStatus[k] = st
			f.Duplicates += d
		}); err != nil {
			return f, err
		}
		for _, id := range chunk {
			grant := GrantID(id)
			st := states[grant]
			switch {
			case st == string(StateGranted) || st == string(StateFailed):
				f.Terminal++
				if st == string(StateGranted) {
					f.Granted++
				}
			case inboxStatus[id] == "failed":
				f.Quarantined++
			case inboxStatus[id] == reasonResolved:
				f.Resolved++
			default:
				f.Lost++
				if len(f.LostIDs) < 5 {
					f.LostIDs = append(f.LostIDs, id)
				}
			}
			f.Coupons += coupons[grant]
			if coupons[grant] > 1 {
				f.DuplicateCoupons += coupons[grant] - 1
			}
		}
	}
	return f, nil
}

func scanPairs(ctx context.Context, db *sql.DB, q string, args []any, fn func(k, v string)) error {
	rows, err := db.QueryContext(ctx, dbx.DialectOf(db).Rebind(q), args...)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		fn(k, v)
	}
	return rows.Err()
}

package coupon

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// historyLimit bounds the transitions grantHistory returns for one order. A grant logs at
// most three per campaign.
const historyLimit = 200

// grantHistory is the plugin's inbox.HistoryFunc. It returns the grant state machine's
// committed transitions for an order, oldest first. orderID is the inbox's dedup key, and
// the grant's id is GrantID of it. grantHistory reads coupon_grant_log through its index on the
// order. Each transition names its campaign. A terminal one also names the coupon granted
// or the reason the grant failed, from coupon_grant.
func grantHistory(ctx context.Context, db *sql.DB, orderID string) ([]inbox.HistoryEntry, error) {
	rows, err := db.QueryContext(ctx, textFor(dbx.DialectOf(db)).history, GrantID(orderID), historyLimit)
	if err != nil {
		return nil, fmt.Errorf("coupon history: %w", err)
	}
	defer rows.Close()
	var out []inbox.HistoryEntry
	for rows.Next() {
		var e inbox.HistoryEntry
		var campaign string
		var couponID, reason sql.NullString
		if err := rows.Scan(&e.At, &e.From, &e.To, &campaign, &couponID, &reason); err != nil {
			return nil, fmt.Errorf("coupon history: %w", err)
		}
		e.Detail = "campaign " + campaign
		switch State(e.To) {
		case StateGranted:
			if couponID.Valid {
				e.Detail += ", coupon " + couponID.String
			}
		case StateFailed:
			if reason.Valid {
				e.Detail += ": " + reason.String
			}
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("coupon history: %w", err)
	}
	return out, nil
}

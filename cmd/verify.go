package onceflowcmd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/outbox"
)

type verifyOpts struct {
	campaign string
	ledgers  []string
	kafka    bool
	wait     time.Duration
	result   bool
}

func (a *app) verifyCmd() *cobra.Command {
	o := verifyOpts{}
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "audit the invariants (one coupon per order, inbox ⇔ grant ⇔ outbox, counters, relay lag); exit 1 on a violation",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.verify(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.campaign, "campaign", "", "campaign id (default: the coupon plugin's configured campaign)")
	f.StringSliceVar(&o.ledgers, "ledger", nil, "producer ledger(s): every order in them must have a coupon or a quarantine record")
	f.BoolVar(&o.kafka, "kafka", false, "also read coupon-granted back (read_committed) and count distinct event ids")
	f.DurationVar(&o.wait, "wait", 0, "wait up to this long for the pipeline to drain before auditing")
	f.BoolVar(&o.result, "result", false, "end with one RESULT line (needs --ledger)")
	return cmd
}

// orderFacts is what the database says about the ledger's orders.
type orderFacts struct {
	terminal, granted, quarantined, coupons, dupCoupons, duplicates, lost int
	lostIDs                                                               []string
}

func (a *app) verify(ctx context.Context, o verifyOpts) error {
	cc := coupon.DefaultConfig()
	if err := decodePluginConfig(coupon.PluginName, a.cfg.Plugins[coupon.PluginName], &cc); err != nil {
		return err
	}
	if o.campaign == "" {
		o.campaign = cc.CampaignID
	}
	if o.result && len(o.ledgers) == 0 {
		return badInput(errors.New("verify --result needs --ledger"))
	}
	var l ledger
	if len(o.ledgers) > 0 {
		var err error
		if l, err = readLedgers(o.ledgers); err != nil {
			return err
		}
	}
	db, err := a.openAppDB(ctx, 4, coreTables...)
	if err != nil {
		return err
	}
	defer db.Close()

	deadline := time.Now().Add(o.wait)
	var facts orderFacts
	var audit coupon.Audit
	for {
		if facts, err = ledgerFacts(ctx, db, o.campaign, l.orders); err != nil {
			return err
		}
		if audit, err = coupon.Verify(ctx, db, o.campaign, a.cfg.Relay.LagBound); err != nil {
			return err
		}
		drained := facts.lost == 0 && audit.OutboxPending == 0 && audit.InboxProcessing == 0 && audit.InFlight == 0
		if drained || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}

	violations := audit.Violations
	if facts.lost > 0 {
		violations = append(violations, fmt.Sprintf("lost: %d ledger orders have neither a terminal grant nor a quarantine record (e.g. %s)",
			facts.lost, strings.Join(facts.lostIDs, ", ")))
	}
	if facts.dupCoupons > 0 {
		violations = append(violations, fmt.Sprintf("duplicate coupons for ledger orders: %d", facts.dupCoupons))
	}
	events, kafkaDups := -1, 0
	if o.kafka {
		events, kafkaDups, err = a.readGrantEvents(ctx, cc.GrantedTopic, l.orders)
		if err != nil {
			return err
		}
		want := int(audit.Granted)
		if len(l.orders) > 0 {
			want = facts.granted
		}
		if events != want {
			violations = append(violations, fmt.Sprintf("kafka: %d distinct CouponGranted events on %s, %d GRANTED grants", events, cc.GrantedTopic, want))
		}
		if kafkaDups > 0 {
			// At-least-once relay (a crash between publish and mark) may repeat an event with
			// the same id; reported, not a violation of the database invariants.
			printf("kafka: %d repeated deliveries of already seen event ids (same event_id; dedupe by header %s)\n", kafkaDups, outbox.HeaderEventID)
		}
	}

	// Invariant 4 is about the relay keeping up: parked events (Kafka refuses them for good,
	// or they wait behind one that it refuses) are not lag, but they are not published either.
	parked, err := outbox.NewParked(db, "")
	if err != nil {
		return err
	}
	refused, held, err := parked.Count(ctx)
	if err != nil {
		return fmt.Errorf("verify: %w (run `router migrate`)", err)
	}

	printf("verify: campaign=%s grants=%d granted=%d failed=%d in_flight=%d coupons=%d duplicate_coupons=%d inbox_done=%d inbox_failed=%d inbox_processing=%d duplicates_blocked=%d outbox=%d outbox_pending=%d outbox_parked=%d\n",
		o.campaign, audit.Grants, audit.Granted, audit.Failed, audit.InFlight, audit.Coupons, audit.DuplicateCoupons,
		audit.InboxDone, audit.InboxFailed, audit.InboxProcessing, audit.DuplicatesBlocked, audit.OutboxEvents, audit.OutboxPending, refused+held)
	if refused+held > 0 {
		printf("PARKED %d outbox events are not published: Kafka refuses %d of them for good, %d wait behind those (router outbox ls; retry or drop them)\n",
			refused+held, refused, held)
	}
	for _, v := range violations {
		printf("VIOLATION %s\n", v)
	}
	if o.result {
		e := events
		if e < 0 {
			e = 0
		}
		printf("RESULT orders=%d deliveries=%d duplicates_blocked=%d coupons=%d grant_events=%d lost=%d duplicate_coupons=%d\n",
			len(l.orders), l.deliveries, facts.duplicates, facts.coupons, e, facts.lost, facts.dupCoupons)
	}
	if len(violations) > 0 {
		return fmt.Errorf("verify: %d invariant violations", len(violations))
	}
	return nil
}

// ledgerFacts checks every ledger order, in chunks.
func ledgerFacts(ctx context.Context, db *sql.DB, campaign string, orders []string) (orderFacts, error) {
	var f orderFacts
	for start := 0; start < len(orders); start += 500 {
		chunk := orders[start:min(start+500, len(orders))]
		in := strings.TrimSuffix(strings.Repeat("?,", len(chunk)), ",")
		args := make([]any, 0, len(chunk)+1)
		args = append(args, campaign)
		for _, id := range chunk {
			args = append(args, id)
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
		args[0] = coupon.BizType
		inboxStatus := map[string]string{}
		if err := scanPairs(ctx, db, `SELECT dedup_key, CONCAT(status, ' ', duplicates) FROM inbox WHERE biz_type = ? AND dedup_key IN (`+in+`)`, args, func(k, v string) {
			var st string
			var d int
			fmt.Sscan(v, &st, &d)
			inboxStatus[k] = st
			f.duplicates += d
		}); err != nil {
			return f, err
		}
		for _, id := range chunk {
			st := states[id]
			switch {
			case st == string(coupon.StateGranted) || st == string(coupon.StateFailed):
				f.terminal++
				if st == string(coupon.StateGranted) {
					f.granted++
				}
			case inboxStatus[id] == "failed":
				f.quarantined++
			default:
				f.lost++
				if len(f.lostIDs) < 5 {
					f.lostIDs = append(f.lostIDs, id)
				}
			}
			f.coupons += coupons[id]
			if coupons[id] > 1 {
				f.dupCoupons += coupons[id] - 1
			}
		}
	}
	return f, nil
}

func scanPairs(ctx context.Context, db *sql.DB, q string, args []any, fn func(k, v string)) error {
	rows, err := db.QueryContext(ctx, q, args...)
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

// readGrantEvents reads the granted topic back with read_committed and counts distinct
// CouponGranted event ids (restricted to the ledger's orders when given) and repeats.
func (a *app) readGrantEvents(ctx context.Context, topic string, orders []string) (distinct, repeats int, err error) {
	recs, err := a.kafka().ReadAll(ctx, topic, 3*time.Second)
	if err != nil {
		return 0, 0, err
	}
	var scope map[string]bool
	if len(orders) > 0 {
		scope = make(map[string]bool, len(orders))
		for _, id := range orders {
			scope[id] = true
		}
	}
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Headers[outbox.HeaderEventType] != coupon.EventGranted || (scope != nil && !scope[r.Key]) {
			continue
		}
		id := r.Headers[outbox.HeaderEventID]
		if seen[id] {
			repeats++
			continue
		}
		seen[id] = true
	}
	return len(seen), repeats, nil
}

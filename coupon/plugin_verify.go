package coupon

import (
	"context"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/outbox"
)

// verifyPlugin is the plugin's Verify, run by `router verify`. It checks the invariants of
// the configured campaign, as Verify does. The runtime checks the relay lag, invariant 4,
// for the whole outbox. verifyPlugin reports what became of a producer ledger's orders,
// with ledgerFacts. With `verify --kafka` it also counts the CouponGranted events on the
// granted topic.
func verifyPlugin(ctx context.Context, env inbox.VerifyEnv) (inbox.Verification, error) {
	cfg, err := settingsOf(env.Settings)
	if err != nil {
		return inbox.Verification{}, err
	}
	facts, err := ledgerFacts(ctx, env.DB, cfg.CampaignID, env.Keys)
	if err != nil {
		return inbox.Verification{}, err
	}
	audit, err := verifyCampaign(ctx, env.DB, cfg.CampaignID)
	if err != nil {
		return inbox.Verification{}, err
	}
	v := inbox.Verification{
		Violations: audit.Violations,
		Pending:    facts.Lost > 0 || audit.OutboxPending > 0 || audit.InboxProcessing > 0 || audit.InFlight > 0,
		Summary: fmt.Sprintf("campaign=%s grants=%d granted=%d failed=%d in_flight=%d coupons=%d duplicate_coupons=%d inbox_done=%d inbox_failed=%d inbox_processing=%d duplicates_blocked=%d outbox=%d outbox_pending=%d",
			cfg.CampaignID, audit.Grants, audit.Granted, audit.Failed, audit.InFlight, audit.Coupons, audit.DuplicateCoupons,
			audit.InboxDone, audit.InboxFailed, audit.InboxProcessing, audit.DuplicatesBlocked, audit.OutboxEvents, audit.OutboxPending),
	}
	if facts.Lost > 0 {
		v.Violations = append(v.Violations, fmt.Sprintf("lost: %d ledger orders have neither a terminal grant nor a quarantine record (e.g. %s)",
			facts.Lost, strings.Join(facts.LostIDs, ", ")))
	}
	if facts.DuplicateCoupons > 0 {
		v.Violations = append(v.Violations, fmt.Sprintf("duplicate coupons for ledger orders: %d", facts.DuplicateCoupons))
	}
	events := 0
	if env.ReadTopic != nil {
		n, repeats, err := grantEvents(ctx, env, cfg.GrantedTopic)
		if err != nil {
			return inbox.Verification{}, err
		}
		events = n
		want := int(audit.Granted)
		if len(env.Keys) > 0 {
			want = facts.Granted
		}
		if n != want {
			v.Violations = append(v.Violations, fmt.Sprintf("kafka: %d distinct CouponGranted events on %s, %d GRANTED grants", n, cfg.GrantedTopic, want))
		}
		if repeats > 0 {
			// An at-least-once relay may repeat an event with the same id, after a crash
			// between publish and mark. That is reported as a note, not as a violation of the
			// database invariants.
			v.Notes = append(v.Notes, fmt.Sprintf("kafka: %d repeated deliveries of already seen event ids (same event_id; dedupe by header %s)", repeats, outbox.HeaderEventID))
		}
	}
	v.Result = fmt.Sprintf("duplicates_blocked=%d coupons=%d grant_events=%d lost=%d duplicate_coupons=%d",
		facts.Duplicates, facts.Coupons, events, facts.Lost, facts.DuplicateCoupons)
	return v, nil
}

// grantEvents reads the granted topic back and counts distinct CouponGranted event ids and
// repeats. When there is a ledger, it counts only the events of the ledger's orders.
func grantEvents(ctx context.Context, env inbox.VerifyEnv, topic string) (distinct, repeats int, err error) {
	recs, err := env.ReadTopic(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	var scope map[string]bool
	if len(env.Keys) > 0 {
		scope = make(map[string]bool, len(env.Keys))
		for _, id := range env.Keys {
			scope[GrantID(id)] = true // an event's key is its grant's id
		}
	}
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Headers[outbox.HeaderEventType] != EventGranted || (scope != nil && !scope[r.Key]) {
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

package coupon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestOrderWithAClaimsIDGetsItsOwnCoupon checks an order whose orderId is a claim's
// claimId, which the client is told. The order gets a coupon of its own, whether it
// arrives before the claim or after it. It goes through the real inbox, one delivery at a
// time or in a group commit's batch. The claim gets its own coupon too, and the audit
// finds nothing. An order's grant is GrantID of its id, which never equals a claim's. If
// an order's grant were its id, whichever of the two came second would end done with no
// coupon.
func TestOrderWithAClaimsIDGetsItsOwnCoupon(t *testing.T) {
	for _, batch := range []bool{false, true} {
		for _, orderFirst := range []bool{true, false} {
			name := fmt.Sprintf("one at a time/order first=%v", orderFirst)
			if batch {
				name = fmt.Sprintf("batch/order first=%v", orderFirst)
			}
			t.Run(name, func(t *testing.T) {
				d := testenv.DB(t, 8, couponSchema)
				ctx := context.Background()
				cfg := campaign("entrances", 10, 10*valueCents)
				g := setup(t, d.DB, cfg, nil)
				orders, err := engine.New(d.DB, plugin(t, d.DB, g), engine.Config{BizType: coupon.BizType}, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				ch, err := g.ClaimHandler(d.DB)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = ch.(io.Closer).Close() })
				claims, err := engine.NewCommand(d.DB, ch, engine.Config{BizType: coupon.ClaimBizType}, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				process := orders.Process
				runClaim := claims.RunCommand
				if batch {
					ob, err := orders.NewBatcher(engine.BatchConfig{})
					if err != nil {
						t.Fatal(err)
					}
					cb, err := claims.NewBatcher(engine.BatchConfig{})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { ob.Close(); cb.Close() })
					process = func(ctx context.Context, msg *message.Message, src inbox.Source, _ engine.ProcessOptions) (engine.Result, error) {
						return ob.Process(ctx, msg, src)
					}
					runClaim = cb.RunCommand
				}

				token := "double-click-" + strings.ReplaceAll(name, " ", "-")
				claimID := coupon.ClaimID(token)
				claim := func() {
					t.Helper()
					body := fmt.Sprintf(`{"userId": "u-claim", "campaignId": %q}`, cfg.CampaignID)
					res, err := runClaim(ctx, engine.CommandRequest{Token: token, Body: []byte(body), Source: inbox.Source{Topic: "http POST " + coupon.ClaimPath, Partition: -1, Offset: -1}})
					if err != nil || res.Outcome != engine.OutcomeProcessed || res.Reply.Status != http.StatusCreated {
						t.Fatalf("claim: %+v %v, want processed, 201", res, err)
					}
					var r coupon.ClaimResponse
					if err := json.Unmarshal(res.Reply.Body, &r); err != nil || r.ClaimID != claimID || r.CouponID == "" {
						t.Fatalf("claim answer %s (%v): want claimId %s and a coupon", res.Reply.Body, err, claimID)
					}
				}
				order := func() {
					t.Helper()
					o := coupon.OrderPaid{OrderID: claimID, UserID: "u-order", AmountCents: 9900, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
					res, err := process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: coupon.OrderPaidTopic, Partition: 0, Offset: 7}, engine.ProcessOptions{})
					if err != nil || res.Outcome != engine.OutcomeProcessed {
						t.Fatalf("order %s: %+v %v, want processed", claimID, res, err)
					}
				}
				if orderFirst {
					order()
					claim()
				} else {
					claim()
					order()
				}

				for _, user := range []string{"u-claim", "u-order"} {
					if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon WHERE campaign_id = ? AND user_id = ?`, cfg.CampaignID, user); n != 1 {
						t.Errorf("%s has %d coupons, want 1", user, n)
					}
				}
				if g := readGrant(t, d.DB, coupon.GrantID(claimID), cfg.CampaignID); g.State != coupon.StateGranted {
					t.Errorf("the order's grant %s is %s, want GRANTED", coupon.GrantID(claimID), g.State)
				}
				if n := count(t, d.DB, `SELECT COUNT(*) FROM outbox WHERE event_type = ?`, coupon.EventGranted); n != 2 {
					t.Errorf("%d CouponGranted events, want 2 (the claim's and the order's)", n)
				}
				mustVerify(t, d.DB, cfg.CampaignID)
			})
		}
	}
}

// TestGrantID checks that GrantID keeps an order id outside the claim namespace as it is.
// An order id inside it becomes "claim-order-" and 40 hex digits. That is never a claim
// id, which is "claim-" and 40 hex digits, and never an order id kept as itself.
func TestGrantID(t *testing.T) {
	claim := coupon.ClaimID("t-1")
	for _, tc := range []struct {
		orderID string
		same    bool
	}{
		{"o-1", true},
		{"Claim-1", true},
		{"xclaim-1", true},
		{"claim-", false},
		{claim, false},
		{"claim-order-" + claim[len("claim-"):], false},
	} {
		got := coupon.GrantID(tc.orderID)
		switch {
		case tc.same && got != tc.orderID:
			t.Errorf("GrantID(%q) = %q, want the order id", tc.orderID, got)
		case !tc.same && (!strings.HasPrefix(got, "claim-order-") || len(got) != len("claim-order-")+40 || got == tc.orderID):
			t.Errorf("GrantID(%q) = %q, want claim-order- and 40 hex digits", tc.orderID, got)
		}
		if got == claim {
			t.Errorf("GrantID(%q) is the claim id of token t-1", tc.orderID)
		}
	}
}

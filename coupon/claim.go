package coupon

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/jsonkeys"
)

// ClaimPath and ClaimBizType name the claim command. A POST to /v1/claims with
// {"userId": "...", "campaignId": "..."} and an Idempotency-Key header grants one coupon.
// The grant runs through the same state machine as a paid order's, and emits the same
// coupon-granted event.
const (
	ClaimPath    = "/v1/claims"
	ClaimBizType = "coupon-claim"
)

// ClaimRequest is the claim command's body.
type ClaimRequest struct {
	UserID     string `json:"userId"`
	CampaignID string `json:"campaignId"`
}

// ClaimResponse is the body of a claim's answer. The status is 201 when the coupon was
// granted. It is 410 when the campaign's stock or budget ran out, and Reason says which.
type ClaimResponse struct {
	ClaimID    string `json:"claimId"`
	CouponID   string `json:"couponId,omitempty"`
	UserID     string `json:"userId"`
	CampaignID string `json:"campaignId"`
	ValueCents int64  `json:"valueCents"`
	State      State  `json:"state"`
	Reason     string `json:"reason,omitempty"`
}

// claimPrefix begins every grant id the HTTP entrance makes, and no other. These ids form
// the claim namespace. An order-paid order id that begins with claimPrefix gets a grant id
// of another form from GrantID.
const claimPrefix = "claim-"

// orderInClaimsPrefix begins the grant id of an order whose id is in the claim namespace.
// The letter after claimPrefix is not a hex digit, so no claim id begins with it.
const orderInClaimsPrefix = claimPrefix + "order-"

// ClaimID is the grant's order id of the claim made with client token token. It is
// claimPrefix and 40 hex digits of the token's sha256. It fits the grant's order id, and no
// order's grant id from GrantID equals it.
func ClaimID(token string) string {
	s := sha256.Sum256([]byte(token))
	return claimPrefix + hex.EncodeToString(s[:20])
}

// GrantID is the grant's id of the order-paid order orderID. It is the grant's
// coupon_grant.order_id, the key of its outside calls and the orderId of its coupon-granted
// event. It is the order id itself, unless the order id begins with claimPrefix. Then it is
// "claim-order-" and 40 hex digits of the order id's sha256. So an order and a claim never
// share a grant, whatever id the order has. An order id kept as itself never begins with
// claimPrefix. A claim id is claimPrefix and 40 hex digits. Every other grant id begins
// with "claim-order-".
func GrantID(orderID string) string {
	if !strings.HasPrefix(orderID, claimPrefix) {
		return orderID
	}
	s := sha256.Sum256([]byte(orderID))
	return orderInClaimsPrefix + hex.EncodeToString(s[:20])
}

// claimCommand is the coupon plugin's claim command.
func claimCommand() inbox.Command {
	return inbox.Command{Method: http.MethodPost, Path: ClaimPath, BizType: ClaimBizType,
		Build: func(ctx context.Context, env inbox.PluginEnv) (inbox.Handler, error) {
			g, err := buildGranter(ctx, env)
			if err != nil {
				return nil, err
			}
			return g.ClaimHandler(env.DB)
		}}
}

// ClaimHandler returns the claim command's handler on pool db. It is the plugin's handler,
// with the same outside calls and the same multi-row grants under group commit. Its orders
// are claims, and it states each claim's answer once the claim's grant is terminal. Close
// it once it is no longer used.
func (g *Granter) ClaimHandler(db *sql.DB) (inbox.Handler, error) {
	return g.handler(db, claimCodec{campaignID: g.cfg.CampaignID}, true)
}

// claimCodec decodes a claim for inbox.Typed. A claim is a JSON body naming the user and
// this router's campaign. A body that is not UTF-8 is refused, and never decoded into
// another user's id. The inbox key is the client token. The fingerprint is the request's
// meaning, its user and campaign. So a retry that only reorders or respaces the JSON is the
// same request.
type claimCodec struct{ campaignID string }

func (c claimCodec) Decode(msg *message.Message) (OrderPaid, string, string, error) {
	if err := inbox.CheckJSONText(msg.Payload); err != nil {
		return OrderPaid{}, "", "", fmt.Errorf("body: %w", err)
	}
	var req ClaimRequest
	// The errors' texts are the client's 400 answers. They are fixed texts, never the JSON
	// decoder's.
	if err := json.Unmarshal(msg.Payload, &req); err != nil {
		return OrderPaid{}, "", "", inbox.PoisonError(`body: not a JSON object {"userId": "...", "campaignId": "..."} of strings`)
	}
	// encoding/json took "USERID" for userId and kept the last of a key given twice.
	if err := jsonkeys.Check(msg.Payload, reflect.TypeOf(req)); err != nil {
		return OrderPaid{}, "", "", inbox.PoisonError("body: %v", err)
	}
	switch {
	case req.UserID == "" || len(req.UserID) > MaxIDLen || !utf8.ValidString(req.UserID):
		return OrderPaid{}, "", "", inbox.PoisonError("userId: want 1..%d bytes of UTF-8", MaxIDLen)
	case req.CampaignID != c.campaignID:
		return OrderPaid{}, "", "", inbox.PoisonError("campaignId: unknown campaign (this router grants %q)", c.campaignID)
	}
	s := sha256.Sum256([]byte(req.UserID + "\x00" + req.CampaignID))
	token := msg.Metadata.Get(inbox.MetadataIdempotencyKey)
	return OrderPaid{OrderID: ClaimID(token), UserID: req.UserID}, token, hex.EncodeToString(s[:]), nil
}

// respond states the answers of ds, whose grants are terminal in tx. The answer is 201
// with the coupon, or 410 when the campaign's stock or budget ran out.
func (h *handler) respond(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	campaignID := h.g.cfg.CampaignID
	args := []any{campaignID}
	for _, d := range ds {
		args = append(args, d.Value.(OrderPaid).OrderID) // the handler checked the type
	}
	rows, err := tx.QueryContext(ctx, h.g.q.Load().d.Rebind(`SELECT order_id, user_id, state, value_cents, coupon_id, reason FROM coupon_grant WHERE campaign_id = ? AND order_id IN (?`+
		strings.Repeat(", ?", len(ds)-1)+`)`), args...)
	if err != nil {
		return fmt.Errorf("read the claims' grants: %w", err)
	}
	defer rows.Close()
	answers := make(map[string]ClaimResponse, len(ds))
	for rows.Next() {
		r := ClaimResponse{CampaignID: campaignID}
		var coupon, reason sql.NullString
		if err := rows.Scan(&r.ClaimID, &r.UserID, &r.State, &r.ValueCents, &coupon, &reason); err != nil {
			return fmt.Errorf("read the claims' grants: %w", err)
		}
		r.CouponID, r.Reason = coupon.String, reason.String
		answers[r.ClaimID] = r
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the claims' grants: %w", err)
	}
	for _, d := range ds {
		r, ok := answers[d.Value.(OrderPaid).OrderID]
		if !ok || !r.State.terminal() {
			return fmt.Errorf("%w: claim %s finished without a terminal grant", errIllegalTransition, d.Key)
		}
		status := http.StatusCreated
		if r.State != StateGranted {
			status = http.StatusGone
		}
		if err := d.Respond(status, r); err != nil {
			return err
		}
	}
	return nil
}

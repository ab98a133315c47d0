package coupon

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

// The claim command: POST /v1/claims with {"userId": "...", "campaignId": "..."} and an
// Idempotency-Key header grants one coupon through the same state machine as a paid order,
// and emits the same coupon-granted event.
const (
	ClaimPath    = "/v1/claims"
	ClaimBizType = "coupon-claim"
)

// ClaimRequest is the claim command's body.
type ClaimRequest struct {
	UserID     string `json:"userId"`
	CampaignID string `json:"campaignId"`
}

// ClaimResponse is the body of a claim's answer (201: granted; 410: the campaign's stock or
// budget ran out, Reason says which).
type ClaimResponse struct {
	ClaimID    string `json:"claimId"`
	CouponID   string `json:"couponId,omitempty"`
	UserID     string `json:"userId"`
	CampaignID string `json:"campaignId"`
	ValueCents int64  `json:"valueCents"`
	State      State  `json:"state"`
	Reason     string `json:"reason,omitempty"`
}

// ClaimID is the grant's order id of the claim made with client token token: "claim-" and
// 40 hex digits of the token's sha256, so claims never take a paid order's id by accident
// and fit the grant's order id.
func ClaimID(token string) string {
	s := sha256.Sum256([]byte(token))
	return "claim-" + hex.EncodeToString(s[:20])
}

// ClaimCommand is the coupon plugin's claim command.
func ClaimCommand() inbox.Command {
	return inbox.Command{Method: http.MethodPost, Path: ClaimPath, BizType: ClaimBizType,
		Build: func(ctx context.Context, env inbox.PluginEnv) (inbox.Handler, error) {
			h, err := Plugin().Build(ctx, env)
			if err != nil {
				return nil, err
			}
			return NewClaimer(h.(*Granter)), nil
		}}
}

// Claimer is the claim command's handler: a Granter whose orders are claims. It keeps the
// Granter's outside calls (Prepare, PrepareDelivery) and multi-row statements, so claims
// that arrive together are granted in one transaction as paid orders are.
type Claimer struct{ *Granter }

// NewClaimer returns the claim handler granting with g.
func NewClaimer(g *Granter) *Claimer { return &Claimer{Granter: g} }

var (
	_ inbox.BatchHandler  = (*Claimer)(nil)
	_ inbox.BatchPreparer = (*Claimer)(nil)
	_ inbox.Preparer      = (*Claimer)(nil)
)

// Decode implements inbox.Handler: a JSON body naming the user and this router's campaign;
// one that is not UTF-8 is refused, never decoded into another user's id.
// The inbox key is the client token; the fingerprint is the request's meaning (user and
// campaign), so a retry that only reorders or respaces the JSON is the same request.
func (c *Claimer) Decode(msg *message.Message) (inbox.Decoded, error) {
	if err := inbox.CheckJSONText(msg.Payload); err != nil {
		return inbox.Decoded{}, fmt.Errorf("%w: body: %w", inbox.ErrPoison, err)
	}
	var req ClaimRequest
	// The errors' texts are the client's 400 answers: fixed, never the JSON decoder's.
	if err := json.Unmarshal(msg.Payload, &req); err != nil {
		return inbox.Decoded{}, inbox.PoisonError(`body: not a JSON object {"userId": "...", "campaignId": "..."} of strings`)
	}
	switch {
	case req.UserID == "" || len(req.UserID) > MaxIDLen || !utf8.ValidString(req.UserID):
		return inbox.Decoded{}, inbox.PoisonError("userId: want 1..%d bytes of UTF-8", MaxIDLen)
	case req.CampaignID != c.cfg.CampaignID:
		return inbox.Decoded{}, inbox.PoisonError("campaignId: unknown campaign (this router grants %q)", c.cfg.CampaignID)
	}
	s := sha256.Sum256([]byte(req.UserID + "\x00" + req.CampaignID))
	token := msg.Metadata.Get(inbox.MetadataIdempotencyKey)
	return inbox.Decoded{Key: token, Fingerprint: hex.EncodeToString(s[:]),
		Value: OrderPaid{OrderID: ClaimID(token), UserID: req.UserID}}, nil
}

// Handle implements inbox.Handler: the grant's steps, all in tx (a claim's token commits
// with its whole effect), then the answer from the grant's final state.
func (c *Claimer) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	for steps := 1; ; steps++ {
		p, err := c.Granter.Handle(ctx, tx, d)
		if err != nil {
			return p, err
		}
		if p == inbox.Done {
			break
		}
		if steps == len(States) {
			return p, fmt.Errorf("%w: the grant of claim %s is not terminal after %d steps", ErrIllegalTransition, d.Key, steps)
		}
	}
	return inbox.Done, c.respond(ctx, tx, []*inbox.Delivery{d})
}

// HandleBatch implements inbox.BatchHandler: the Granter's multi-row grants, then one read
// of the finished grants for the answers.
func (c *Claimer) HandleBatch(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	progs, err := c.Granter.HandleBatch(ctx, tx, ds)
	if err != nil {
		return nil, err
	}
	var done []*inbox.Delivery
	for i, d := range ds {
		if progs[i] == inbox.Done {
			done = append(done, d)
		}
	}
	return progs, c.respond(ctx, tx, done)
}

// respond states the answers of ds, whose grants are terminal in tx: 201 with the coupon,
// or 410 when the campaign's stock or budget ran out.
func (c *Claimer) respond(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	args := []any{c.cfg.CampaignID}
	for _, d := range ds {
		args = append(args, d.Value.(OrderPaid).OrderID) // Granter.Handle(Batch) checked the type
	}
	rows, err := tx.QueryContext(ctx, `SELECT order_id, user_id, state, value_cents, coupon_id, reason FROM coupon_grant WHERE campaign_id = ? AND order_id IN (?`+
		strings.Repeat(", ?", len(ds)-1)+`)`, args...)
	if err != nil {
		return fmt.Errorf("read the claims' grants: %w", err)
	}
	defer rows.Close()
	answers := make(map[string]ClaimResponse, len(ds))
	for rows.Next() {
		r := ClaimResponse{CampaignID: c.cfg.CampaignID}
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
		if !ok || !r.State.Terminal() {
			return fmt.Errorf("%w: claim %s finished without a terminal grant", ErrIllegalTransition, d.Key)
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

package coupon

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

// TestClaimBodyFieldNamesExact checks that a claim body's field names match exactly. A
// userId in another case, or given twice, is refused with the reason. encoding/json alone
// would take the last userId, or the one in capitals, as the claim's user.
func TestClaimBodyFieldNamesExact(t *testing.T) {
	c := claimCodec{campaignID: "c1"}
	for _, tc := range []struct {
		name, body string
		user       string // what encoding/json decodes as the user
		want       string // the answer; "" when accepted
	}{
		{"exact", `{"userId":"u-1","campaignId":"c1"}`, "u-1", ""},
		{"unknown field", `{"userId":"u-1","campaignId":"c1","channel":"app"}`, "u-1", ""},
		{"userId in capitals", `{"USERID":"u-2","campaignId":"c1"}`, "u-2", `body: field name in another case: "USERID" at byte 1 is field "userId"`},
		{"userId, then in lower case", `{"userId":"u-3","userid":"u-4","campaignId":"c1"}`, "u-4", `body: field name in another case: "userid" at byte 16 is field "userId"`},
		{"userId given twice", `{"userId":"u-5","campaignId":"c1","userId":"u-6"}`, "u-6", `body: key given twice: "userId" at byte 34`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req ClaimRequest
			if err := json.Unmarshal([]byte(tc.body), &req); err != nil || req.UserID != tc.user {
				t.Fatalf("encoding/json decodes %s as %+v %v, want user %s", tc.body, req, err, tc.user)
			}
			msg := message.NewMessage("m", []byte(tc.body))
			msg.Metadata.Set(inbox.MetadataIdempotencyKey, "k-1")
			o, _, _, err := c.Decode(msg)
			if tc.want == "" {
				if err != nil || o.UserID != tc.user {
					t.Fatalf("Decode(%s) = %+v %v, want user %s", tc.body, o, err, tc.user)
				}
				return
			}
			if !errors.Is(err, inbox.ErrPoison) || err.Error() != inbox.PoisonError("%s", tc.want).Error() {
				t.Fatalf("Decode(%s) = %+v %v, want poison %q", tc.body, o, err, tc.want)
			}
		})
	}
}

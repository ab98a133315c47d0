package routercmd

import (
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestInboxLsFindsPoisonRowByOrderID checks that `router inbox ls --order-id` finds a poison
// row by its record's Kafka key and by its payload's id, with or without --biz-type. Its
// dedup key names the record's place in Kafka. An unrelated id finds nothing.
func TestInboxLsFindsPoisonRowByOrderID(t *testing.T) {
	d := testenv.DB(t, 4, registeredMigrations()...)
	ctx := context.Background()
	g, err := coupon.NewGranter(coupon.DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := engine.New(d.DB, g, engine.Config{BizType: coupon.BizType, KeyLogField: "order_id", MaxAttempts: 1, DelayedRetries: -1}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"oc-pz-0093","userId":"u1","amountCents":"990"}`))
	msg.SetContext(msgsource.WithKey(ctx, "k-pz-0093"))
	if r, err := ib.Process(ctx, msg, inbox.Source{Topic: "order-paid", Partition: 1, Offset: 7}, engine.ProcessOptions{}); err != nil || r.Reason != engine.ReasonPoison {
		t.Fatalf("%+v %v", r, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--order-id", "oc-pz-0093"}, "poison:order-paid/1/7"},
		{[]string{"--order-id", "k-pz-0093"}, "poison:order-paid/1/7"},
		{[]string{"--order-id", "oc-pz-0093", "--biz-type", coupon.BizType, "--status", "failed"}, "poison:order-paid/1/7"},
		{[]string{"--order-id", "oc-pz-0094"}, ""},
	} {
		args := append([]string{"--dsn", d.DSN, "inbox", "ls"}, tc.args...)
		out, err := capture(t, args...)
		if err != nil {
			t.Fatalf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		switch {
		case tc.want != "" && (!strings.Contains(out, tc.want) || !strings.Contains(out, `kafka key "k-pz-0093"`) || !strings.Contains(out, "\n1 rows\n")):
			t.Errorf("inbox ls %s: want the poison row alone:\n%s", strings.Join(tc.args, " "), out)
		case tc.want == "" && (strings.Contains(out, "poison:") || !strings.Contains(out, "\n0 rows\n")):
			t.Errorf("inbox ls %s: want no row:\n%s", strings.Join(tc.args, " "), out)
		}
	}
}

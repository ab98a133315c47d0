package coupon_test

import (
	"context"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
)

// TestHistory checks that History lists an order's committed transitions, oldest first,
// with the coupon granted or the reason the grant failed. An order it never saw has none.
// The plugin declares History as its inbox.Plugin.History, for the console's row page.
func TestHistory(t *testing.T) {
	d := testenv.DB(t, 4, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	ctx := context.Background()
	g := setup(t, d.DB, campaign("hist", 1, 10*valueCents), nil)
	for _, id := range []string{"o-granted", "o-failed"} {
		for {
			p, err := step(ctx, d.DB, g, order(id))
			if err != nil {
				t.Fatal(err)
			}
			if p == inbox.Done {
				break
			}
		}
	}
	h, err := coupon.History(ctx, d.DB, "o-granted")
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range h {
		steps = append(steps, e.From+">"+e.To)
		if e.At.IsZero() || !strings.HasPrefix(e.Detail, "campaign hist") {
			t.Errorf("entry %+v: want a time and the campaign", e)
		}
	}
	if got := strings.Join(steps, " "); got != "INIT>LOCKED LOCKED>BUDGET_DEDUCTED BUDGET_DEDUCTED>GRANTED" {
		t.Fatalf("granted order's history %q", got)
	}
	if !strings.Contains(h[2].Detail, ", coupon ") {
		t.Errorf("the grant's last entry %q does not name the coupon", h[2].Detail)
	}
	h, err = coupon.History(ctx, d.DB, "o-failed")
	if err != nil || len(h) != 1 || h[0].To != string(coupon.StateFailed) || !strings.Contains(h[0].Detail, "stock") {
		t.Fatalf("failed order's history %+v %v, want one move to FAILED naming the stock", h, err)
	}
	if h, err := coupon.History(ctx, d.DB, "o-never"); err != nil || len(h) != 0 {
		t.Fatalf("unknown order: %+v %v", h, err)
	}
	if coupon.Plugin().History == nil {
		t.Fatal("the plugin declares no History")
	}
}

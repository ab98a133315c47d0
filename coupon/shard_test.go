package coupon_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestShardedCountersExhaustCampaignWide checks stock and budget split over shards. An
// order whose own shard is empty takes from the next one. So the campaign grants exactly
// what an unsharded campaign would, and the per-shard counters stay equal to what the
// grants imply.
func TestShardedCountersExhaustCampaignWide(t *testing.T) {
	cases := []struct {
		name              string
		stock, budgetUnit int64
		shards            int
		orders            int
		wantGranted       int
	}{
		{"stock bound, 20 over 16 shards", 20, 1000, 16, 30, 20},
		{"budget bound, 7 coupons over 4 shards", 1000, 7, 4, 12, 7},
		{"one shard", 5, 5, 1, 8, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := testenv.DB(t, 16, couponSchema)
			cfg := campaign("shard-"+fmt.Sprint(tc.shards), tc.stock, tc.budgetUnit*500)
			cfg.Shards = tc.shards
			g := setup(t, d.DB, cfg, nil)
			var wg sync.WaitGroup
			errs := make(chan error, tc.orders)
			for i := range tc.orders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := runToDone(context.Background(), d.DB, g, order(fmt.Sprintf("s-%03d", i))); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			granted := count(t, d.DB, "SELECT COUNT(*) FROM coupon_grant WHERE state = 'GRANTED'")
			failed := count(t, d.DB, "SELECT COUNT(*) FROM coupon_grant WHERE state = 'FAILED'")
			if granted != tc.wantGranted || failed != tc.orders-tc.wantGranted {
				t.Fatalf("granted %d failed %d, want %d and %d", granted, failed, tc.wantGranted, tc.orders-tc.wantGranted)
			}
			a := mustVerify(t, d.DB, cfg.CampaignID)
			if a.Coupons != int64(tc.wantGranted) {
				t.Fatalf("coupons %d", a.Coupons)
			}
			// The check can fail. Attribute one grant to another shard, with the totals
			// unchanged, and the per-shard audit sees it.
			if tc.shards > 1 {
				var moved string
				if err := d.DB.QueryRow(rb(`SELECT MIN(order_id) FROM coupon_grant WHERE campaign_id = ? AND state = 'GRANTED'`), cfg.CampaignID).Scan(&moved); err != nil {
					t.Fatal(err)
				}
				if _, err := d.DB.Exec(rb(`UPDATE coupon_grant SET stock_shard = MOD(stock_shard + 1, ?) WHERE campaign_id = ? AND order_id = ?`),
					tc.shards, cfg.CampaignID, moved); err != nil {
					t.Fatal(err)
				}
				a, err := coupon.Verify(context.Background(), d.DB, cfg.CampaignID, 0)
				if err != nil || !containsInvariant(a.Violations, 3) {
					t.Fatalf("a unit moved between shards was not caught: %v %v", a.Violations, err)
				}
			}
		})
	}
}

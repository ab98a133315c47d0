package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
)

// TestKeysCompareExactly checks that business keys compare exactly, byte for byte. Orders
// whose ids differ only in trailing spaces or in case are different orders. Each gets its
// inbox row and its coupon, one at a time and in one batch. A PAD SPACE collation such as
// utf8mb4_bin would take "h1-g1 " for "h1-g1". The order would then be a conflict or a
// duplicate, with no coupon of its own. Migration 00013 and coupon's 00002 set NO PAD
// collations.
func TestKeysCompareExactly(t *testing.T) {
	keys := []string{"h1-g1", "h1-g1 ", "h1-g1  ", "A", "a"}
	for _, batch := range []bool{false, true} {
		name := "one at a time"
		if batch {
			name = "in one batch"
		}
		t.Run(name, func(t *testing.T) {
			p := newPipeline(t, pipelineOpts{conns: 8})
			ctx := context.Background()
			process := func(key string) (engine.Result, error) {
				return p.inbox.Process(ctx, orderMsg(key, "u-"+key), inbox.Source{Topic: "order-paid"}, engine.ProcessOptions{})
			}
			if batch {
				b, err := p.inbox.NewBatcher(engine.BatchConfig{Linger: 50 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				process = func(key string) (engine.Result, error) {
					return b.Process(ctx, orderMsg(key, "u-"+key), inbox.Source{Topic: "order-paid"})
				}
			}
			results := make([]engine.Result, len(keys))
			var wg sync.WaitGroup
			for i, k := range keys {
				wg.Go(func() {
					r, err := process(k)
					if err != nil {
						t.Error(err)
					}
					results[i] = r
				})
			}
			wg.Wait()
			for i, r := range results {
				if r.Outcome != engine.OutcomeProcessed || r.Key != keys[i] {
					t.Errorf("order %q: %s of key %q (reason %s), want processed", keys[i], r.Outcome, r.Key, r.Reason)
				}
			}
			for _, k := range keys {
				rows := count(t, p.db.DB, "SELECT COUNT(*) FROM inbox WHERE dedup_key = ? AND biz_type = ? AND status = 'done'", k, p.inbox.BizType())
				coupons := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon WHERE order_id = ?", k)
				if rows != 1 || coupons != 1 {
					t.Errorf("order %q: %d done inbox rows, %d coupons, want 1 and 1", k, rows, coupons)
				}
			}
			if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon"); n != len(keys) {
				t.Errorf("coupons: %d, want %d", n, len(keys))
			}
		})
	}
}

package engine_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// blockingService blocks the first call of one step until released.
type blockingService struct {
	step    string
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (s *blockingService) Call(ctx context.Context, step, _ string) error {
	if step == s.step {
		s.once.Do(func() {
			close(s.entered)
			<-s.release
		})
	}
	return nil
}

// TestSlowExternalCallHoldsNoLock checks external calls that take seconds. With the
// plugin's Prepare, the calls happen outside any transaction. While one is in flight,
// another transaction can lock the order's inbox row and grant at once. The bare granter
// has no Prepare, and makes each step's call inside its transaction. So it holds both
// locks for the whole call, which the same probe detects.
func TestSlowExternalCallHoldsNoLock(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prepare    bool
		wantLocked bool
	}{
		{"prepare: call outside the transaction", true, false},
		{"no prepare: call inside the transaction", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testenv.DB(t, 8, couponSchema)
			cfg := coupon.DefaultConfig()
			ctx := context.Background()
			if err := coupon.EnsureCampaign(ctx, d.DB, cfg); err != nil {
				t.Fatal(err)
			}
			svc := &blockingService{step: "deduct_budget", entered: make(chan struct{}), release: make(chan struct{})}
			g, err := coupon.NewGranter(cfg, svc, nil)
			if err != nil {
				t.Fatal(err)
			}
			var h inbox.Handler = g
			if tc.prepare {
				if h, err = g.Handler(d.DB); err != nil {
					t.Fatal(err)
				}
				if _, ok := h.(inbox.Preparer); !ok {
					t.Fatal("the plugin's handler with a slow service is no Preparer")
				}
			}
			ib, err := engine.New(d.DB, h, engine.Config{BizType: coupon.BizType}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan engine.Result, 1)
			go func() {
				r, err := ib.Process(ctx, orderMsg("slow-1", "u1"), src, engine.ProcessOptions{})
				if err != nil {
					t.Error(err)
				}
				done <- r
			}()
			select {
			case <-svc.entered:
			case <-time.After(30 * time.Second):
				t.Fatal("the deduct_budget call never started")
			}
			// The probe locks the inbox row and the grant without waiting.
			locked := false
			probe := func(q string) {
				err := func() error {
					tx, err := d.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
					if err != nil {
						return err
					}
					defer tx.Rollback()
					var n int
					return tx.QueryRowContext(ctx, q).Scan(&n)
				}()
				if err != nil {
					t.Logf("probe %q: %v", q, err)
					locked = true
				}
			}
			probe("SELECT COUNT(*) FROM (SELECT id FROM inbox WHERE dedup_key = 'slow-1' FOR UPDATE NOWAIT) r")
			probe("SELECT COUNT(*) FROM (SELECT order_id FROM coupon_grant WHERE order_id = 'slow-1' FOR UPDATE NOWAIT) r")
			close(svc.release)
			r := <-done
			if r.Outcome != engine.OutcomeProcessed {
				t.Fatalf("outcome %+v", r)
			}
			if locked != tc.wantLocked {
				t.Fatalf("rows locked during the external call: %v, want %v", locked, tc.wantLocked)
			}
			if n := count(t, d.DB, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'slow-1'"); n != 1 {
				t.Fatalf("coupons %d", n)
			}
		})
	}
}

package coupon_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// stepService counts calls per idempotency key. The first fail[key] calls of a key fail.
type stepService struct {
	mu    sync.Mutex
	calls map[string]int
	fail  map[string]int
}

func (s *stepService) Call(_ context.Context, _, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[key]++
	if s.fail[key] > 0 {
		s.fail[key]--
		return errors.New("marketing centre: 503")
	}
	return nil
}

// TestPrepareMakesASucceededCallOnce checks a grant whose second call fails after its first
// succeeded. It is retried from the failed step, never from the one that succeeded. Each
// step gets one successful call, whatever failed in between. Here the failed call fails
// again on its next try, so the attempt fails.
func TestPrepareMakesASucceededCallOnce(t *testing.T) {
	db := testenv.DB(t, 4, couponSchema).DB
	svc := &stepService{calls: map[string]int{}, fail: map[string]int{"m-1:deduct_budget": 2}}
	cfg := campaign("made-calls", 10, 10*valueCents)
	g := setup(t, db, cfg, svc)
	ib, err := engine.New(db, plugin(t, db, g), engine.Config{BizType: coupon.BizType, MaxAttempts: 3, BackoffInitial: time.Millisecond,
		BackoffMax: time.Millisecond, DelayedRetries: -1, BreakerOff: true}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ib.Process(context.Background(), message.NewMessage(watermill.NewUUID(), order("m-1").Encode()), inbox.Source{Topic: "order-paid"}, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeProcessed || r.Attempts != 2 {
		t.Fatalf("%+v, %v: want processed at the second attempt", r, err)
	}
	want := map[string]int{"m-1:lock_stock": 1, "m-1:deduct_budget": 3, "m-1:write_wallet": 1}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for k, n := range want {
		if svc.calls[k] != n {
			t.Errorf("%s: %d calls, want %d (all: %v)", k, svc.calls[k], n, svc.calls)
		}
	}
}

// TestAnotherRouterStartsFromTheFailedStep checks a grant's call that fails after earlier
// ones succeeded. The steps made commit. So another router that runs the grant later starts
// from the failed step. Here that is the delayed redelivery on a second router, whose
// handler remembers no call.
func TestAnotherRouterStartsFromTheFailedStep(t *testing.T) {
	db := testenv.DB(t, 4, couponSchema).DB
	svc := &stepService{calls: map[string]int{}, fail: map[string]int{"m-2:deduct_budget": 2}}
	g := setup(t, db, campaign("made-calls-2", 10, 10*valueCents), svc)
	cfg := engine.Config{BizType: coupon.BizType, MaxAttempts: 1, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond,
		DelayedRetries: 3, DelayedBackoff: time.Millisecond, BreakerOff: true}
	a, err := engine.New(db, plugin(t, db, g), cfg, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := engine.New(db, plugin(t, db, g), cfg, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.Process(context.Background(), message.NewMessage(watermill.NewUUID(), order("m-2").Encode()), inbox.Source{Topic: "order-paid"}, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeDelayed {
		t.Fatalf("router A: %+v, %v: want delayed", r, err)
	}
	if n, err := b.RedeliverDue(context.Background(), time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("router B redelivered %d, %v; want 1", n, err)
	}
	want := map[string]int{"m-2:lock_stock": 1, "m-2:deduct_budget": 3, "m-2:write_wallet": 1}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for k, n := range want {
		if svc.calls[k] != n {
			t.Errorf("%s: %d calls, want %d (all: %v)", k, svc.calls[k], n, svc.calls)
		}
	}
}

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
	"github.com/onceflow/onceflow/internal/testenv"
)

// stepService counts calls per idempotency key; the first call of each key in failOnce fails.
type stepService struct {
	mu       sync.Mutex
	calls    map[string]int
	failOnce map[string]bool
}

func (s *stepService) Call(_ context.Context, _, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[key]++
	if s.failOnce[key] {
		delete(s.failOnce, key)
		return errors.New("marketing centre: 503")
	}
	return nil
}

// A grant whose second call fails after its first succeeded commits nothing, and its next
// attempt calls the failed step again but not the one that succeeded: one successful call
// per step, whatever failed in between.
func TestPrepareMakesASucceededCallOnce(t *testing.T) {
	db := testenv.DB(t, 4, couponSchema).DB
	svc := &stepService{calls: map[string]int{}, failOnce: map[string]bool{"m-1:deduct_budget": true}}
	cfg := campaign("made-calls", 10, 10*valueCents)
	g := setup(t, db, cfg, svc)
	ib, err := inbox.New(db, plugin(t, db, g), inbox.Config{BizType: coupon.BizType, MaxAttempts: 3, BackoffInitial: time.Millisecond,
		BackoffMax: time.Millisecond, DelayedRetries: -1, BreakerOff: true}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ib.Process(context.Background(), message.NewMessage(watermill.NewUUID(), order("m-1").Encode()), inbox.Source{Topic: "order-paid"}, inbox.ProcessOptions{})
	if err != nil || r.Outcome != inbox.OutcomeProcessed || r.Attempts != 2 {
		t.Fatalf("%+v, %v: want processed at the second attempt", r, err)
	}
	want := map[string]int{"m-1:lock_stock": 1, "m-1:deduct_budget": 2, "m-1:write_wallet": 1}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for k, n := range want {
		if svc.calls[k] != n {
			t.Errorf("%s: %d calls, want %d (all: %v)", k, svc.calls[k], n, svc.calls)
		}
	}
}

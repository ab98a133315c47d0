package engine_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

type captureLogger struct {
	mu     sync.Mutex
	fields []watermill.LogFields
}

func (l *captureLogger) rec(f watermill.LogFields) {
	l.mu.Lock()
	l.fields = append(l.fields, f)
	l.mu.Unlock()
}
func (l *captureLogger) Error(_ string, _ error, f watermill.LogFields)     { l.rec(f) }
func (l *captureLogger) Info(_ string, f watermill.LogFields)               { l.rec(f) }
func (l *captureLogger) Debug(_ string, f watermill.LogFields)              { l.rec(f) }
func (l *captureLogger) Trace(_ string, f watermill.LogFields)              { l.rec(f) }
func (l *captureLogger) With(f watermill.LogFields) watermill.LoggerAdapter { return l }

// TestLogFieldsNameTheBusinessKey checks that log lines name the business key as the
// plugin calls it, order_id, and carry the origin.
func TestLogFieldsNameTheBusinessKey(t *testing.T) {
	d := testenv.DB(t, 4, couponSchema)
	g, err := coupon.NewGranter(coupon.DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := &captureLogger{}
	ib, err := engine.New(d.DB, g, engine.Config{BizType: coupon.BizType, KeyLogField: "order_id"}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A conflicting payload for a known key is logged with the key and the origin.
	ctx := context.Background()
	if err := coupon.EnsureCampaign(ctx, d.DB, coupon.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	src := inbox.Source{Topic: "order-paid", Partition: 4, Offset: 77}
	if _, err := ib.Process(ctx, orderMsg("o-log", "u1"), src, engine.ProcessOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Process(ctx, orderMsg("o-log", "u2"), src, engine.ProcessOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte("{")), src, engine.ProcessOptions{}); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	found := 0
	for _, f := range log.fields {
		if f["order_id"] != nil && f["partition"] == int32(4) && f["offset"] == int64(77) {
			found++
		}
	}
	if found < 2 {
		t.Fatalf("log lines with order_id, partition and offset: %d, want ≥ 2 (conflict and poison): %v", found, log.fields)
	}
}

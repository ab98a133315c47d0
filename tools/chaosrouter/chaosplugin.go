package main

// The chaos harness's misbehaving plugin (the stock router, cmd/router, has no such
// plugin). It consumes order-paid in a consumer group and biz type of its own, decodes
// orders as the coupon granter does (key = order id), writes nothing and returns Done —
// except that, chosen by chaosplan.For from the order id, ~2 % of the orders make it panic
// and ~0.5 % make it block for ever, ignoring its context. The inbox must end those
// quarantined with reason panic resp. timeout, and the partitions must move on; the
// checker (tools/chaos) predicts both subsets with the same function.

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/chaosplan"
)

const (
	misbehaverName    = "chaos-misbehaver"
	misbehaverGroup   = "chaos-misbehaver"
	misbehaverBizType = "chaos"
)

type misbehaver struct{}

var _ inbox.Handler = misbehaver{}

func (misbehaver) Decode(msg *message.Message) (inbox.Decoded, error) {
	o, err := coupon.DecodeOrderPaid(msg.Payload)
	if err != nil {
		return inbox.Decoded{}, inbox.PoisonError("%v", err)
	}
	return inbox.Decoded{Key: o.OrderID, Fingerprint: o.Fingerprint(), Value: o}, nil
}

func (misbehaver) Handle(_ context.Context, _ *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	switch chaosplan.For(d.Key) {
	case chaosplan.Panic:
		panic(fmt.Sprintf("chaos-misbehaver: planned panic for order %s (attempt %d)", d.Key, d.Attempt))
	case chaosplan.Block:
		select {} // never returns, whatever the context says
	}
	return inbox.Done, nil
}

func init() {
	inbox.MustRegister(inbox.Plugin{
		Name:          misbehaverName,
		Topics:        []string{coupon.OrderPaidTopic},
		ConsumerGroup: misbehaverGroup,
		BizType:       misbehaverBizType,
		KeyLogField:   "order_id",
		Build:         func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return misbehaver{}, nil },
	})
}

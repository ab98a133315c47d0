package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/msgsource"
)

// HandlerFunc adapts the inbox to a Watermill router handler for messages consumed from
// topic. It returns nil, an ack, once the delivery's outcome is committed, whatever it
// was. It returns an error, a nack and a redelivery, only when nothing could be recorded.
func (ib *Inbox) HandlerFunc(topic string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		res, err := ib.Process(msg.Context(), msg, SourceOf(msg, topic), ProcessOptions{})
		if err == nil {
			err = ib.awaitDelayed(msg.Context(), res)
		}
		return err
	}
}

// holdsKey reports whether awaitDelayed waits for res: with Config.DelayedHoldsKafkaKey,
// the outcome of a delivery left for its delayed redelivery.
func (ib *Inbox) holdsKey(res Result) bool {
	return ib.cfg.DelayedHoldsKafkaKey && res.Reason == ReasonDelayed && (res.Outcome == OutcomeDelayed || res.Outcome == OutcomeHeld)
}

// awaitDelayed waits, with Config.DelayedHoldsKafkaKey, until the row of a delivery that
// waits for its delayed redelivery has ended, done or quarantined. The message stays
// unacked meanwhile, and the subscriber holds back the later messages of its Kafka key.
// When ctx ends first, on a shutdown or a lost partition, awaitDelayed returns an error.
// The message then stays unacked, to be delivered again.
func (ib *Inbox) awaitDelayed(ctx context.Context, res Result) error {
	if !ib.holdsKey(res) {
		return nil
	}
	q := ib.d.Rebind(`SELECT status, reason FROM ` + ib.cfg.Table + ` WHERE id = ?`)
	logged := false
	for {
		var status Status
		var reason sql.NullString
		err := ib.db.QueryRowContext(ctx, q, res.InboxID).Scan(&status, &reason)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil
		case err == nil && (status != StatusFailed || Reason(reason.String) != ReasonDelayed):
			return nil
		case err == nil && !logged:
			logged = true
			ib.logger.Info("waiting for the key's delayed redelivery; later messages of its Kafka key wait behind it",
				watermill.LogFields{ib.cfg.KeyLogField: res.Key, "inbox_id": res.InboxID})
		}
		t := time.NewTimer(ib.cfg.RedeliverEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("inbox %s %q: waiting for its delayed redelivery: %w", ib.cfg.BizType, res.Key, ctx.Err())
		case <-t.C:
		}
	}
}

// ContextWithSource records where a message came from, for subscribers other than
// watermill-kafka's. watermill-kafka records it in its own context keys.
// kafkax.ParallelSubscriber sets it.
func ContextWithSource(ctx context.Context, src inbox.Source) context.Context {
	return msgsource.With(ctx, msgsource.Source(src))
}

// SourceOf returns where msg was consumed from. It is the Source set by ContextWithSource,
// else watermill-kafka's partition and offset, with topic as the topic.
func SourceOf(msg *message.Message, topic string) inbox.Source {
	ctx := msg.Context()
	if ms, ok := msgsource.From(ctx); ok {
		s := inbox.Source(ms)
		if s.Topic == "" {
			s.Topic = topic
		}
		return s
	}
	src := inbox.Source{Topic: topic}
	if p, ok := wkafka.MessagePartitionFromCtx(ctx); ok {
		src.Partition = p
	}
	if o, ok := wkafka.MessagePartitionOffsetFromCtx(ctx); ok {
		src.Offset = o
	}
	return src
}

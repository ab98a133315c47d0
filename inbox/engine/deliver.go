package engine

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/chanx"
)

// Deliver runs one live delivery consumed from topic, as HandlerFunc(topic) does, without
// waiting for it: done is called once, with what that handler would have returned (nil:
// ack; an error: nack). A consumer loop calls it for each message it reads, so a delivery
// costs no goroutine of its own while its batch runs: done runs on the goroutine that
// answers the batch, and must not block. A delivery off that path runs on a goroutine of
// its own, as HandlerFunc would: the circuit breaker not closed, tracing on, a failed
// attempt, a fallback to the one-at-a-time path, a delayed outcome that holds its Kafka key.
// Deliver blocks while the decoders' queue is full, until msg's context ends.
func (b *Batcher) Deliver(msg *message.Message, topic string, done func(error)) {
	ctx := msg.Context()
	if b.ib.tr != nil {
		b.deliverAlone(msg, topic, done)
		return
	}
	p := &pending{ctx: ctx, msg: msg, src: SourceOf(msg, topic), then: done, b: b}
	if br := b.ib.br; br != nil {
		if !br.tryAdmit(&p.admitted) {
			b.deliverAlone(msg, topic, done)
			return
		}
		p.ticket = &p.admitted
	}
	p.start = time.Now()
	if !chanx.TrySend(b.decode, p, b.stop) {
		select {
		case b.decode <- p:
		case <-b.stop:
			p.ticket.done(verdictNone)
			b.deliverAlone(msg, topic, done) // Process runs it one at a time
			return
		case <-ctx.Done():
			p.ticket.done(verdictNone)
			done(ctx.Err())
			return
		}
	}
	// Close drains the queue once its decoders returned. A delivery queued after that
	// drain is answered here.
	select {
	case <-b.closed:
		drain(b.decode)
	default:
	}
}

// deliverAlone runs msg through HandlerFunc on a goroutine of its own. A panic there
// becomes its error, as Watermill's Recoverer middleware makes it in a router.
func (b *Batcher) deliverAlone(msg *message.Message, topic string, done func(error)) {
	go func() {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("inbox %s: panic delivering message %s: %v", b.ib.cfg.BizType, msg.UUID, r)
				}
			}()
			err = b.HandlerFunc(topic)(msg)
		}()
		done(err)
	}()
}

// settle tells Deliver's caller the outcome of p, a delivery it queued. It runs where p was
// answered. Off the happy path it goes on, as Process would, on a goroutine of its own.
func (b *Batcher) settle(p *pending) {
	o := p.out
	if o.failed == nil && !o.fallback && !b.ib.holdsKey(o.res) {
		if o.res.Outcome == OutcomeProcessed {
			p.ticket.done(verdictSuccess)
		} else {
			p.ticket.done(verdictNone)
		}
		b.release(p, o.res, nil)
		p.then(nil)
		return
	}
	go func() {
		res, err := b.outcome(p.ctx, p, o)
		p.ticket.done(verdictNone) // when no outcome said more
		if err == nil {
			err = b.ib.awaitDelayed(p.ctx, res)
		}
		p.then(err)
	}()
}

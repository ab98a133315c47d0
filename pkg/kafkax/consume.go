package kafkax

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// DeliverFunc runs one consumed message without waiting for it, and calls done once with
// the handler's error: nil acks the message, an error nacks it. done may run on any
// goroutine, and does not block. engine.Batcher.Deliver is one.
type DeliverFunc func(msg *message.Message, done func(error))

// Alone adapts a handler to a DeliverFunc that runs each message on a goroutine of its
// own, as Watermill's router runs a handler. A panic becomes the message's error, as
// Watermill's Recoverer middleware makes it.
func Alone(h message.NoPublishHandlerFunc) DeliverFunc {
	return func(msg *message.Message, done func(error)) {
		go func() {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("panic handling message %s: %v", msg.UUID, r)
					}
				}()
				err = h(msg)
			}()
			done(err)
		}()
	}
}

// ConsumeCloseTimeout is how long Consume, once its subscription's messages stopped
// coming, waits for the deliveries it handed out, as Watermill's router waits for its
// handlers on Close.
const ConsumeCloseTimeout = 30 * time.Second

// Consume subscribes to topic with sub, reads its messages until the channel closes, hands
// each to deliver, and settles it (Settle: ack or nack, and for a ParallelSubscriber's
// message its claim told at once) when the delivery is done. It takes the place of a
// Watermill router with one handler, without a goroutine per message where the DeliverFunc
// needs none (engine.Batcher.Deliver). A failed delivery is logged at ERROR with name, as
// the router logs a handler's error. Once the channel closed, Consume waits up to
// ConsumeCloseTimeout for the deliveries still running. It returns an error when the
// channel closed while ctx had not ended.
//
// A delivery's done only queues the message for a goroutine of the subscription's, which
// settles it. Settling may hand out the next message of its key on the subscriber's
// channel, which this loop reads; the loop may itself wait in deliver for room in the
// queue of a batch whose worker calls done. Settled on the worker, the two would wait for
// each other.
func Consume(ctx context.Context, sub message.Subscriber, topic, name string, deliver DeliverFunc, logger watermill.LoggerAdapter) error {
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", topic, err)
	}
	var inFlight sync.WaitGroup
	st := newSettler(func(msg *message.Message, err error) {
		if err != nil {
			logger.Error("Handler returned error, the message is delivered again", err, watermill.LogFields{
				"handler": name, "topic": topic, "message_uuid": msg.UUID})
		}
		Settle(msg, err)
		inFlight.Done()
	})
	for msg := range msgs {
		inFlight.Add(1)
		deliver(msg, func(err error) { st.add(msg, err) })
	}
	finished := make(chan struct{})
	go func() { inFlight.Wait(); close(finished) }()
	t := time.NewTimer(ConsumeCloseTimeout)
	defer t.Stop()
	select {
	case <-finished:
	case <-t.C:
		logger.Error("deliveries still running after the subscription ended", nil, watermill.LogFields{
			"handler": name, "topic": topic, "waited": ConsumeCloseTimeout.String()})
	}
	st.close()
	if ctx.Err() == nil {
		return fmt.Errorf("the subscription to %s (%s) ended on its own", topic, name)
	}
	return nil
}

// settler runs fn for each message added, in the order added, on a goroutine of its own.
// add never blocks: what waits is held in a slice, no more than the messages in flight.
type settler struct {
	fn   func(*message.Message, error)
	mu   sync.Mutex
	q    []settled
	wake chan struct{} // one pending wake-up
	stop chan struct{}
	done chan struct{}
}

type settled struct {
	msg *message.Message
	err error
}

func newSettler(fn func(*message.Message, error)) *settler {
	st := &settler{fn: fn, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go st.run()
	return st
}

func (st *settler) add(msg *message.Message, err error) {
	st.mu.Lock()
	st.q = append(st.q, settled{msg, err})
	first := len(st.q) == 1
	st.mu.Unlock()
	if first { // else a wake-up is pending, or run has not yet taken the queue it wakes for
		select {
		case st.wake <- struct{}{}:
		default:
		}
	}
}

func (st *settler) run() {
	defer close(st.done)
	var spare []settled
	for {
		stopping := false
		select {
		case <-st.wake:
		case <-st.stop:
			stopping = true
		}
		st.mu.Lock()
		batch := st.q
		st.q = spare[:0]
		st.mu.Unlock()
		for i, x := range batch {
			st.fn(x.msg, x.err)
			batch[i] = settled{}
		}
		spare = batch
		if stopping {
			return
		}
	}
}

// close settles what was added, then stops the goroutine. Nothing may be added after.
func (st *settler) close() {
	close(st.stop)
	<-st.done
}

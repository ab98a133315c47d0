package kafkax_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// ackRouter is a ParallelSubscriber in group and a Watermill router with AckOnReturn, as
// the runtime builds them.
func ackRouter(t *testing.T, c kafkax.Config, group string, pc kafkax.ParallelConfig) (*kafkax.ParallelSubscriber, *message.Router) {
	t.Helper()
	sub, err := c.NewParallelSubscriber(group, pc, tlog{t: t})
	if err != nil {
		t.Fatal(err)
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(kafkax.AckOnReturn)
	return sub, r
}

// TestParallelSubscriberAckOnReturn runs a Watermill router with AckOnReturn over a window
// of 4. Every message is handled. A message nacked by an error is handed out again. So is
// one whose handler panicked, which the router recovers and nacks. Each key's messages
// never run at once. The middleware told the claim of acks. The committed offset reaches
// the end of the partition.
func TestParallelSubscriberAckOnReturn(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-ackonreturn", 1)
	var recs []rec
	for i := range 40 {
		k := fmt.Sprintf("k%d", i%8)
		recs = append(recs, rec{0, k, fmt.Sprintf("%s/%d", k, i)})
	}
	produce(t, c, topic, true, recs)
	group := uniqueGroup("parallel-ackonreturn")
	sub, r := ackRouter(t, c, group, kafkax.ParallelConfig{Window: 4})
	var mu sync.Mutex
	seen, running := map[string]int{}, map[string]bool{}
	done := make(chan struct{})
	var once sync.Once
	r.AddConsumerHandler("h", topic, sub, func(m *message.Message) error {
		p, k := string(m.Payload), keyOf(m)
		mu.Lock()
		if running[k] {
			mu.Unlock()
			t.Errorf("two messages of key %s at once", k)
			return nil
		}
		running[k] = true
		seen[p]++
		n := seen[p]
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[k] = false
			if len(seen) == len(recs) {
				once.Do(func() { close(done) })
			}
			mu.Unlock()
		}()
		switch {
		case p == "k3/3" && n == 1:
			return errors.New("nack once")
		case p == "k5/13" && n == 1:
			panic("panic once")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = r.Run(ctx) }()
	defer func() { cancel(); <-stopped }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		mu.Lock()
		t.Fatalf("handled %d of %d messages", len(seen), len(recs))
	}
	mu.Lock()
	if seen["k3/3"] != 2 || seen["k5/13"] != 2 {
		t.Errorf("the nacked message ran %d times, the panicking one %d; want 2 each", seen["k3/3"], seen["k5/13"])
	}
	mu.Unlock()
	if !kafkax.Told(sub) {
		t.Error("the claim was never told of an ack by AckOnReturn")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		lag := testenv.CommittedLag(t, c, group, topic)
		if lag[0] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed lag %v, want 0", lag)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAckOnReturnHandOutBeforeClose checks a handler's ack that AckOnReturn tells. The ack
// hands out the next message of its key from the handler's goroutine, here while the router
// stops. The claim waits for that before it returns. So the subscriber never closes its
// output channel under a send. Under -race, a send with no order to the close fails the
// test. Without -race it could panic.
func TestAckOnReturnHandOutBeforeClose(t *testing.T) {
	c := testenv.Kafka(t)
	for round := range 20 {
		topic := testenv.Topic(t, c, "parallel-ack-close", 1)
		produce(t, c, topic, true, []rec{{0, "b", "b/0"}, {0, "a", "a/0"}, {0, "a", "a/1"}})
		sub, r := ackRouter(t, c, uniqueGroup("parallel-ack-close"), kafkax.ParallelConfig{})
		first := make(chan struct{}) // a/0 is being handled: its return hands out a/1
		var once sync.Once
		r.AddConsumerHandler("h", topic, sub, func(m *message.Message) error {
			if string(m.Payload) == "a/0" {
				once.Do(func() { close(first) })
			}
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		go func() { defer close(stopped); _ = r.Run(ctx) }()
		select {
		case <-first:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: a/0 never handled", round)
		}
		cancel()
		<-stopped
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

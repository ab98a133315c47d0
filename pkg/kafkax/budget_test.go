package kafkax_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// payloadOf is a value of n bytes starting with name and a slash. keyOf reads the name.
func payloadOf(name string, n int) string {
	return name + "/" + strings.Repeat("x", n-len(name)-1)
}

// TestParallelSubscriberByteBudget uses a window of 256 but a budget of about three records
// of 100 KB. The fourth record waits until one of the three is acked. A record bigger than
// the whole budget still goes out once nothing else is in flight. Without the budget all
// six are handed out at once.
func TestParallelSubscriberByteBudget(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-budget", 1)
	const size = 100_000
	recs := []rec{
		{0, "a", payloadOf("a", size)}, {0, "b", payloadOf("b", size)}, {0, "c", payloadOf("c", size)},
		{0, "d", payloadOf("d", size)}, {0, "big", payloadOf("big", 500_000)}, {0, "e", payloadOf("e", size)},
	}
	produce(t, c, topic, true, recs)
	limit := int64(3*(size+kafkax.RecordOverhead) + 200) // three records and their headers
	sub, ch := subscribe(t, c, uniqueGroup("parallel-budget"), topic, kafkax.ParallelConfig{MaxInFlightBytes: limit})

	got := map[string]*message.Message{}
	take := func(want string) {
		t.Helper()
		m := receive(t, ch, 20*time.Second, "want "+want)
		if keyOf(m) != want {
			t.Fatalf("got %q, want %q", keyOf(m), want)
		}
		got[want] = m
	}
	take("a")
	take("b")
	take("c")
	quiet(t, ch, 1500*time.Millisecond, "d must wait for the budget")
	for _, st := range sub.PartitionStats() {
		if st.InFlight != 3 || st.InFlightBytes > limit || st.InFlightBytes < 3*size {
			t.Fatalf("partition stats: %d in flight costing %d bytes, want 3 costing at most the budget %d", st.InFlight, st.InFlightBytes, limit)
		}
	}
	got["b"].Ack() // not the oldest: the budget counts bytes in flight, not the window's span
	take("d")
	quiet(t, ch, 1000*time.Millisecond, "the big record needs the whole budget")
	for _, k := range []string{"a", "c", "d"} {
		got[k].Ack()
	}
	take("big")
	quiet(t, ch, 1000*time.Millisecond, "e must wait while the big record holds the whole budget")
	got["big"].Ack()
	take("e")
	got["e"].Ack()
}

// TestParallelSubscriberSharedBudget checks that two subscribers of one Budget share it, as
// a router's do. Records of the second topic wait while the first holds the budget.
func TestParallelSubscriberSharedBudget(t *testing.T) {
	c := testenv.Kafka(t)
	t1 := testenv.Topic(t, c, "parallel-budget-a", 1)
	t2 := testenv.Topic(t, c, "parallel-budget-b", 1)
	const size = 100_000
	produce(t, c, t1, true, []rec{{0, "a1", payloadOf("a1", size)}, {0, "a2", payloadOf("a2", size)}})
	produce(t, c, t2, true, []rec{{0, "b1", payloadOf("b1", size)}})
	budget := kafkax.NewBudget(2*(size+kafkax.RecordOverhead) + 200)
	_, ch1 := subscribe(t, c, uniqueGroup("parallel-budget-a"), t1, kafkax.ParallelConfig{Budget: budget})
	m1 := receive(t, ch1, 20*time.Second, "a1")
	m2 := receive(t, ch1, 20*time.Second, "a2")
	_, ch2 := subscribe(t, c, uniqueGroup("parallel-budget-b"), t2, kafkax.ParallelConfig{Budget: budget})
	quiet(t, ch2, 3*time.Second, "b1 must wait: the shared budget is held by the other topic")
	if budget.InUse() > budget.Limit() || budget.InUse() < 2*size {
		t.Fatalf("budget in use %d of %d, want the two records", budget.InUse(), budget.Limit())
	}
	m1.Ack()
	m2.Ack()
	receive(t, ch2, 20*time.Second, "b1 after the other topic's acks").Ack()
}

// TestParallelSubscriberCutsOversizedValues checks that a value over MaxValueBytes is
// handed out as a copy of its first bytes, with its size and sha256 in the context. Values
// within the limit and a tombstone are handed out as they are.
func TestParallelSubscriberCutsOversizedValues(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-cut", 1)
	big := payloadOf("big", 300_000)
	produce(t, c, topic, true, []rec{{0, "small", payloadOf("small", 1000)}, {0, "big", big}})
	_, ch := subscribe(t, c, uniqueGroup("parallel-cut"), topic, kafkax.ParallelConfig{MaxValueBytes: 1000})

	small := receive(t, ch, 20*time.Second, "small")
	if string(small.Payload) != payloadOf("small", 1000) {
		t.Fatalf("a value at the limit was changed: %d bytes", len(small.Payload))
	}
	if _, cut := msgsource.CutFrom(small.Context()); cut {
		t.Fatal("a value at the limit is marked cut")
	}
	m := receive(t, ch, 20*time.Second, "big")
	cut, ok := msgsource.CutFrom(m.Context())
	switch {
	case !ok:
		t.Fatalf("a value of %d bytes over the limit of 1000 was not cut (payload %d bytes)", len(big), len(m.Payload))
	case !bytes.Equal(m.Payload, []byte(big[:1000])):
		t.Fatalf("cut payload is %d bytes, want the value's first 1000", len(m.Payload))
	case cut.Size != len(big) || cut.SHA256 != sha256.Sum256([]byte(big)):
		t.Fatalf("cut size %d, want %d; or its sha256 differs", cut.Size, len(big))
	}
	small.Ack()
	m.Ack()
}

// TestBudgetWaitsInOrder checks that waits are first come, first served. A charge over the
// limit takes all of it. A cancelled wait charges nothing.
func TestBudgetWaitsInOrder(t *testing.T) {
	b := kafkax.NewBudget(100)
	ctx := context.Background()
	if n := kafkax.BudgetAcquire(b, ctx, 60); n != 60 {
		t.Fatalf("charged %d, want 60", n)
	}
	big := make(chan int64)
	go func() { big <- kafkax.BudgetAcquire(b, ctx, 1000) }() // waits for all 100
	time.Sleep(50 * time.Millisecond)
	small := make(chan int64)
	go func() { small <- kafkax.BudgetAcquire(b, ctx, 10) }() // would fit, but queues behind big
	select {
	case <-small:
		t.Fatal("a small charge overtook a waiting big one")
	case <-time.After(200 * time.Millisecond):
	}
	kafkax.BudgetRelease(b, 60)
	if n := <-big; n != 100 {
		t.Fatalf("a charge over the limit took %d, want the whole budget (100)", n)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if n := kafkax.BudgetAcquire(b, cctx, 5); n != 0 {
		t.Fatalf("a cancelled wait charged %d", n)
	}
	kafkax.BudgetRelease(b, 100)
	if n := <-small; n != 10 || b.InUse() != 10 {
		t.Fatalf("small charged %d, in use %d; want 10 and 10", n, b.InUse())
	}
}

package kafkax

import (
	"context"
	"testing"

	"github.com/IBM/sarama"
)

// The feed charges a record once though Sarama may show it to the interceptor twice (again
// after MaxProcessingTime ran out while it waited for room in the channel); the claim
// takes the charge over; closing gives back what was charged and not taken, and a record
// of a partition no claim reads is neither charged nor changed.
func TestFeedChargesEachRecordOnce(t *testing.T) {
	s := &ParallelSubscriber{budget: NewBudget(1 << 20)}
	f := newFeed(s, "t")
	ra := f.open(0, context.Background())
	rec := func(p int32, off int64) *sarama.ConsumerMessage {
		return &sarama.ConsumerMessage{Topic: "t", Partition: p, Offset: off, Key: []byte("k"), Value: make([]byte, 1000),
			Headers: []*sarama.RecordHeader{{Key: []byte("h"), Value: []byte("v")}}}
	}
	cost := int64(1000 + 1 + 2 + RecordOverhead)

	a, b, c := rec(0, 1), rec(0, 2), rec(0, 3)
	f.OnConsume(a)
	f.OnConsume(a) // met again: not charged twice
	f.OnConsume(b)
	f.OnConsume(c)
	if n, bytes := ra.held(); n != 3 || bytes != 3*cost || s.budget.InUse() != 3*cost {
		t.Fatalf("held %d records of %d bytes, budget %d; want 3 of %d", n, bytes, s.budget.InUse(), 3*cost)
	}
	if a.Value != nil || a.Key != nil || a.Headers != nil {
		t.Fatal("a charged record still holds the fetch response's bytes")
	}
	ch, ok := ra.take(b) // a was dropped: given back
	if !ok || ch.cost != cost || ch.key != "k" || len(ch.msg.Payload) != 1000 || ch.msg.Metadata.Get("h") != "v" {
		t.Fatalf("take: %v, cost %d, key %q, payload %d bytes, metadata %v", ok, ch.cost, ch.key, len(ch.msg.Payload), ch.msg.Metadata)
	}
	if n, bytes := ra.held(); n != 1 || bytes != cost || s.budget.InUse() != 2*cost {
		t.Fatalf("after take: held %d records of %d bytes, budget %d; want c held and b's charge the claim's", n, bytes, s.budget.InUse())
	}
	other := rec(5, 1)
	f.OnConsume(other)
	if other.Value == nil || s.budget.InUse() != 2*cost {
		t.Fatal("a record of a partition no claim reads was charged or changed")
	}
	f.close(0, ra)
	if s.budget.InUse() != cost {
		t.Fatalf("after close: budget %d, want only the claim's %d", s.budget.InUse(), cost)
	}
	late := rec(0, 4)
	f.OnConsume(late)
	if late.Value == nil || s.budget.InUse() != cost {
		t.Fatal("a record after the claim stopped reading was charged or changed")
	}
	s.budget.release(ch.cost)

	// A read-ahead left open by a session that ended is not the next session's.
	ended, end := context.WithCancel(context.Background())
	stale := f.open(1, ended)
	end()
	if f.open(1, context.Background()) == stale {
		t.Fatal("a new claim got the read-ahead of a session that ended")
	}
}

package kafkax_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// waitStats polls sub.PartitionStats until ok accepts them.
func waitStats(t *testing.T, sub *kafkax.ParallelSubscriber, what string, ok func([]kafkax.PartitionStat) bool) []kafkax.PartitionStat {
	t.Helper()
	var st []kafkax.PartitionStat
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st = sub.PartitionStats(); ok(st) {
			return st
		}
	}
	t.Fatalf("%s: partition stats never matched; last %+v", what, st)
	return nil
}

func lag(s kafkax.PartitionStat) int64 {
	n, ok := s.Lag()
	if !ok {
		return -1
	}
	return n
}

// statOf returns the stat of partition p, or ok false.
func statOf(st []kafkax.PartitionStat, p int32) (kafkax.PartitionStat, bool) {
	for _, s := range st {
		if s.Partition == p {
			return s, true
		}
	}
	return kafkax.PartitionStat{}, false
}

// TestParallelSubscriberPartitionStats follows one group's partitions. Un-acked messages
// show as in flight with an age, and as lag. Acks move the marked offset. After a rebalance
// only its new owner reports each partition, never the old one too.
func TestParallelSubscriberPartitionStats(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-stats", 2)
	counts := [2]int{10, 4}
	var recs []rec
	for p, n := range counts {
		for i := range n {
			recs = append(recs, rec{int32(p), "", fmt.Sprintf("/%d", i)})
		}
	}
	produce(t, c, topic, true, recs)
	group := uniqueGroup("parallel-stats")

	sub1, ch1 := subscribe(t, c, group, topic, kafkax.ParallelConfig{})
	if st := sub1.PartitionStats(); len(st) != 0 {
		t.Fatalf("stats before any claim: %+v", st)
	}
	held := map[pos]*message.Message{}
	for len(held) < len(recs) {
		m := receive(t, ch1, 20*time.Second, fmt.Sprintf("%d received", len(held)))
		src := sourceOf(m)
		held[pos{src.Partition, src.Offset}] = m
	}
	// Nothing is acked, so everything is in flight and lagging. For a new group the marked
	// offset starts at the first message.
	waitStats(t, sub1, "nothing acked", func(st []kafkax.PartitionStat) bool {
		if len(st) != 2 {
			return false
		}
		for p, n := range counts {
			s, _ := statOf(st, int32(p))
			if s.Group != group || s.Topic != topic || s.HighWater != int64(n) || s.Marked != 0 || s.InFlight != n ||
				lag(s) != int64(n) || s.OldestUnackedAge <= 0 {
				return false
			}
		}
		return true
	})

	// Ack all of partition 1, and offsets 0-4 and 7 of partition 0. 7 is not contiguous.
	for off := range counts[1] {
		held[pos{1, int64(off)}].Ack()
	}
	for _, off := range []int64{0, 1, 2, 3, 4, 7} {
		held[pos{0, off}].Ack()
	}
	waitStats(t, sub1, "after acks", func(st []kafkax.PartitionStat) bool {
		s0, ok0 := statOf(st, 0)
		s1, ok1 := statOf(st, 1)
		return ok0 && ok1 &&
			s0.Marked == 5 && s0.InFlight == 4 && lag(s0) == 5 && s0.OldestUnackedAge > 0 &&
			s1.Marked == 4 && s1.InFlight == 0 && lag(s1) == 0 && s1.OldestUnackedAge == 0
	})

	// A second member joins. After the rebalance each partition has one owner. The old
	// owner no longer reports the partition it gave up, because its claims ended and the
	// new ones started.
	sub2, ch2 := subscribe(t, c, group, topic, kafkax.ParallelConfig{})
	for _, m := range held {
		m.Ack() // lets the old claims drain at once; acks of already acked messages are no-ops
	}
	go func() {
		for m := range ch2 {
			m.Ack()
		}
	}()
	deadline := time.Now().Add(45 * time.Second)
	for {
		st1, st2 := sub1.PartitionStats(), sub2.PartitionStats()
		if len(st1) == 1 && len(st2) == 1 && st1[0].Partition != st2[0].Partition {
			t.Logf("after the rebalance: %+v / %+v", st1[0], st2[0])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no clean split after the rebalance: %+v / %+v", st1, st2)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// sub1 may still receive redeliveries of what it owns now, so ack them too.
	go func() {
		for m := range ch1 {
			m.Ack()
		}
	}()
	for _, sub := range []*kafkax.ParallelSubscriber{sub1, sub2} {
		waitStats(t, sub, "caught up", func(st []kafkax.PartitionStat) bool {
			return len(st) == 1 && lag(st[0]) == 0 && st[0].InFlight == 0 && st[0].OldestUnackedAge == 0
		})
	}

	_ = sub1.Close()
	_ = sub2.Close()
	if st := append(sub1.PartitionStats(), sub2.PartitionStats()...); len(st) != 0 {
		t.Fatalf("stats after Close: %+v", st)
	}
}

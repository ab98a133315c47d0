package kafkax_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestParallelSubscriberSweepSleepsWhenIdle acks messages without AckOnReturn, so only the
// sweep of each claim's window finds the acks. Every ack is found and committed. Once
// nothing is in flight, the claims stop sweeping. Messages produced after the pause are
// found and committed again, so a hand-out wakes the sleeping sweep.
func TestParallelSubscriberSweepSleepsWhenIdle(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-sweep-idle", 2)
	group := uniqueGroup("parallel-sweep-idle")
	sub, ch := subscribe(t, c, group, topic, kafkax.ParallelConfig{Window: 8})
	round := func(name string, from int) {
		t.Helper()
		var recs []rec
		for i := range 20 {
			recs = append(recs, rec{int32(i % 2), "", fmt.Sprintf("%s/%d", name, from+i)})
		}
		produce(t, c, topic, true, recs)
		for range recs {
			receive(t, ch, 30*time.Second, name).Ack()
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			lag := testenv.CommittedLag(t, c, group, topic)
			if lag[0] == 0 && lag[1] == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: committed lag %v, want 0 on both partitions", name, lag)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	round("first", 0)
	if kafkax.Told(sub) {
		t.Fatal("AckOnReturn told a claim; this test needs the sweep to find the acks")
	}
	// The sweep that finds the last ack leaves nothing to look for: at most one more sweep
	// per claim, then none.
	time.Sleep(200 * time.Millisecond)
	before := kafkax.Sweeps(sub)
	time.Sleep(time.Second)
	if n := kafkax.Sweeps(sub) - before; n > 2 {
		t.Errorf("%d sweeps in a second with nothing in flight (every 20 ms: 100), want at most 2", n)
	}
	round("second", 20)
}

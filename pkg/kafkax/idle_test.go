package kafkax_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// waitPaused waits until the idler holds want claims of sub paused, and then until a fetch
// sent before the pause has surely returned: Sarama waits kafka.max_poll_wait for it.
func waitPaused(t *testing.T, sub *kafkax.ParallelSubscriber, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for kafkax.IdlePaused(sub) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d claims paused, want %d", what, kafkax.IdlePaused(sub), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if n := kafkax.IdlePaused(sub); n != want {
		t.Fatalf("%s: %d claims paused after the last fetch, want %d", what, n, want)
	}
}

// txProduce writes payloads to partition p in one Kafka transaction and commits or aborts it.
func txProduce(t *testing.T, c kafkax.Config, topic string, p int32, commit bool, payloads ...string) {
	t.Helper()
	sc := c.ProducerConfig()
	sc.Producer.Partitioner = sarama.NewManualPartitioner
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = uniqueGroup("idle-tx")
	prod, err := sarama.NewSyncProducer(c.Brokers, sc)
	if err != nil {
		t.Fatalf("transactional producer: %v", err)
	}
	defer prod.Close()
	if err := prod.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	for _, s := range payloads {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p, Value: sarama.StringEncoder(s)}); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		err = prod.CommitTxn()
	} else {
		err = prod.AbortTxn()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestParallelSubscriberIdlePausesAndWakes leaves a subscription with nothing to read. The
// idler pauses every claim, so Sarama stops fetching. A record written then is read: the
// idler sees the partition grow and resumes. A partition whose tail is a transaction's
// commit or abort marker, past the last record read, is paused again: only markers and
// aborted records lie there. With kafka.idle_after 0 nothing is paused.
func TestParallelSubscriberIdlePausesAndWakes(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-idle", 3)
	pc := kafkax.ParallelConfig{IdleAfter: 300 * time.Millisecond, IdlePoll: 50 * time.Millisecond}
	sub, ch := subscribe(t, c, uniqueGroup("parallel-idle"), topic, pc)

	round := func(name string, n int) {
		t.Helper()
		var recs []rec
		for i := range n {
			recs = append(recs, rec{int32(i % 3), "", fmt.Sprintf("%s/%d", name, i)})
		}
		produce(t, c, topic, true, recs)
		sent := time.Now()
		for range recs {
			receive(t, ch, 30*time.Second, name).Ack()
		}
		t.Logf("%s: the last of %d records read %s after they were written", name, n, time.Since(sent).Round(time.Millisecond))
	}
	round("first", 6)
	waitPaused(t, sub, 3, "after the first records")
	round("while paused", 3)
	waitPaused(t, sub, 3, "after records read while paused")

	txProduce(t, c, topic, 1, true, "committed/0", "committed/1")
	for range 2 {
		receive(t, ch, 30*time.Second, "committed transaction").Ack()
	}
	waitPaused(t, sub, 3, "behind a commit marker")
	txProduce(t, c, topic, 2, false, "aborted/0")
	// The abort marker moves the partition's end: the claim resumes, reads nothing, and
	// is paused again.
	quiet(t, ch, 2*time.Second, "aborted transaction")
	waitPaused(t, sub, 3, "behind an abort marker")
	round("after the markers", 3)
	waitPaused(t, sub, 3, "at the end")
}

// TestParallelSubscriberIdleOff keeps fetching with kafka.idle_after 0.
func TestParallelSubscriberIdleOff(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-idle-off", 2)
	pc := kafkax.ParallelConfig{IdleAfter: -1, IdlePoll: 50 * time.Millisecond}
	sub, ch := subscribe(t, c, uniqueGroup("parallel-idle-off"), topic, pc)
	produce(t, c, topic, true, []rec{{0, "", "a"}, {1, "", "b"}})
	for range 2 {
		receive(t, ch, 30*time.Second, "records").Ack()
	}
	time.Sleep(time.Second)
	if n := kafkax.IdlePaused(sub); n != 0 {
		t.Fatalf("%d claims paused with idle_after off, want 0", n)
	}
}

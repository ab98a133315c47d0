package kafkax_test

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestParallelSubscriberReadAheadInBudget reads 12 partitions of 1 MB records with a window
// of one and a handler that holds every message it gets. The client holds the records in
// Sarama's channels and those handed out. What it holds never costs more than the budget of
// 20 MiB, and every record is charged to it. The budget is what stops the reading. It is
// spent while 36 records remain to read. At rest the partition stats account for all of it,
// the records read ahead behind each full window included. Sarama reads ahead up to 32
// records a partition. Uncharged, its channels would hold 12 and more beside the 12 handed
// out. Once the subscriber is closed nothing is charged any more. A second group that acks
// reads all 36 through a budget of 8 MiB.
func TestParallelSubscriberReadAheadInBudget(t *testing.T) {
	c := testenv.Kafka(t)
	const parts, perPart, size = 12, 3, 1_000_000
	topic := testenv.TopicWithConfig(t, c, "parallel-readahead", parts, map[string]string{"max.message.bytes": "2000000"})
	pc := c.ProducerConfig()
	pc.Producer.MaxMessageBytes = 2_000_000
	pc.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(c.Brokers, pc)
	if err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("x", size)
	for part := range int32(parts) {
		var msgs []*sarama.ProducerMessage
		for i := range perPart {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: part, Key: sarama.StringEncoder(string(rune('a' + i))), Value: sarama.StringEncoder(value)})
		}
		if err := p.SendMessages(msgs); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	const records = parts * perPart

	limit := int64(20 << 20)
	budget := kafkax.NewBudget(limit)
	sub, ch := subscribe(t, c, uniqueGroup("parallel-readahead"), topic, kafkax.ParallelConfig{Window: 1, Budget: budget})
	var held []*message.Message
	var peak int
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		for drained := false; !drained; {
			select {
			case m := <-ch:
				held = append(held, m)
			default:
				drained = true
			}
		}
		// Count the handed out records first, then the queued ones. A record moves from the
		// channel to the handler, never back, so none is counted twice.
		n := len(held) + kafkax.SaramaQueued(sub)
		inUse := budget.InUse()
		peak = max(peak, n)
		if int64(n)*size > limit {
			t.Fatalf("the client holds %d records of %d bytes (%d handed out), over the budget of %d bytes", n, size, len(held), limit)
		}
		if int64(n)*size > inUse {
			t.Fatalf("the client holds %d records of %d bytes (%d handed out), the budget charges %d bytes for them", n, size, len(held), inUse)
		}
	}
	if inUse, cost := budget.InUse(), int64(size+kafkax.RecordOverhead); inUse+cost <= limit || len(held) == 0 || len(held) == records {
		t.Fatalf("budget in use %d of %d, %d of %d records handed out (at most %d held at once): want the budget spent, with records left to read", inUse, limit, len(held), records, peak)
	}
	// At rest every charge is a record's in Sarama's channel or in the window.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ahead, inFlight int64
		for _, st := range sub.PartitionStats() {
			ahead, inFlight = ahead+st.ReadAheadBytes, inFlight+st.InFlightBytes
		}
		if ahead > 0 && ahead+inFlight == budget.InUse() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition stats account for %d bytes read ahead and %d in flight, the budget charges %d; want records read ahead, and all of it", ahead, inFlight, budget.InUse())
		}
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if inUse := budget.InUse(); inUse != 0 {
		t.Fatalf("%d bytes still charged after Close", inUse)
	}

	budget = kafkax.NewBudget(8 << 20)
	_, ch = subscribe(t, c, uniqueGroup("parallel-readahead"), topic, kafkax.ParallelConfig{Budget: budget})
	for i := range records {
		receive(t, ch, 30*time.Second, "record "+string(rune('0'+i%10))).Ack()
	}
	for deadline := time.Now().Add(10 * time.Second); budget.InUse() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still charged after every record was acked", budget.InUse())
		}
	}
}

package kafkax_test

import (
	"fmt"
	"testing"

	"github.com/IBM/sarama"
	"github.com/rcrowley/go-metrics"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// produceRequests sends batches batches of n messages with a producer of sc. The keys
// spread over every partition of topic. It returns how many produce requests the batches
// took, from Sarama's own per-API request meter of API key 0, Produce.
func produceRequests(t *testing.T, c kafkax.Config, sc *sarama.Config, topic string, batches, n int) int64 {
	t.Helper()
	sc.MetricRegistry = metrics.NewRegistry() // kafkax's configs keep no metrics (NoMetrics)
	p, err := sarama.NewSyncProducer(c.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	send := func(prefix string) {
		msgs := make([]*sarama.ProducerMessage, n)
		for i := range msgs {
			msgs[i] = &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("%s-%d", prefix, i)), Value: sarama.StringEncoder("v")}
		}
		if err := p.SendMessages(msgs); err != nil {
			t.Fatal(err)
		}
	}
	// First come the metadata, the producer id and Sarama's per-partition producers,
	// outside the count. A partition's first message starts its producer.
	for i := range 3 {
		send(fmt.Sprintf("warm-up-%d", i))
	}
	meter := func() int64 {
		m, ok := sc.MetricRegistry.Get("protocol-requests-rate-0").(interface{ Count() int64 })
		if !ok {
			t.Fatal("no produce request meter in Sarama's metric registry")
		}
		return m.Count()
	}
	before := meter()
	for b := range batches {
		send(fmt.Sprintf("k-%d", b))
	}
	return meter() - before
}

// TestProducerSendsABatchInOneRequest checks that a SendMessages batch of the project's
// producer goes out as one produce request. With Sarama's flush-at-once default, the same
// batches take more, because the first message leaves alone with one request in flight.
// The test shows that too with PublisherConfig, which has no wait and serves one message
// per call. So a regression of either fails it.
func TestProducerSendsABatchInOneRequest(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "flush", 12)
	const batches, n = 5, 40

	// Each batch takes one request. A busy machine may take longer than FlushWait to hand a
	// batch's messages through Sarama's goroutines, since make test runs packages in
	// parallel. Such a batch may take more.
	got := produceRequests(t, c, c.ProducerConfig(), topic, batches, n)
	if got >= 2*batches {
		t.Errorf("ProducerConfig: %d batches of %d messages took %d produce requests, want about one each", batches, n, got)
	}
	t.Logf("ProducerConfig: %d produce requests for %d batches", got, batches)

	// PublisherConfig, for one message per call, has no flush wait, so batches leave in
	// pieces.
	if got := produceRequests(t, c, c.PublisherConfig(), topic, batches, n); got <= batches {
		t.Errorf("PublisherConfig, without the flush wait: %d batches took %d produce requests: expected more than one each (is the test still able to tell? does PublisherConfig wait?)", batches, got)
	} else {
		t.Logf("PublisherConfig, without the flush wait: %d produce requests for %d batches", got, batches)
	}
}

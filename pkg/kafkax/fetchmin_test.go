package kafkax_test

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestConfigFetchMinBytes checks that kafka.fetch_min_bytes defaults to 64 KiB, with
// kafka.max_poll_wait at 20 ms. It takes 1, which answers at the first record. It reaches
// the subscribers' fetches. It stays off the consumers that read a partition to its end,
// such as the relay's positions reader and the read-backs.
func TestConfigFetchMinBytes(t *testing.T) {
	c := kafkax.Config{Brokers: []string{"127.0.0.1:9092"}}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.FetchMinBytes != 65536 || c.MaxPollWait != 20*time.Millisecond {
		t.Fatalf("defaults fetch_min_bytes %d, max_poll_wait %s; want 65536, 20ms", c.FetchMinBytes, c.MaxPollWait)
	}
	for _, bad := range []int{-1, 64<<20 + 1} {
		c.FetchMinBytes = bad
		if err := c.Validate(); err == nil {
			t.Fatalf("fetch_min_bytes %d accepted", bad)
		}
	}
	c.FetchMinBytes = 1
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.FetchMinBytes = 131072
	if got := c.ConsumerConfig().Consumer.Fetch.Min; got != 1 {
		t.Fatalf("ConsumerConfig's fetch.min.bytes %d, want 1 (it reads partitions to their end)", got)
	}
	sub, err := c.NewParallelSubscriber("fetch-min-unused", kafkax.ParallelConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if got := kafkax.FetchMin(sub); got != 131072 {
		t.Fatalf("subscriber's fetch.min.bytes %d, want 131072", got)
	}
}

// TestParallelSubscriberFetchMinBytesDelivers sets fetch_min_bytes far above what is
// produced. A lone small record, and one with an empty value, are still handed out once
// kafka.max_poll_wait has passed. The setting delays a fetch and never holds a record back.
func TestParallelSubscriberFetchMinBytesDelivers(t *testing.T) {
	c := testenv.Kafka(t)
	c.FetchMinBytes = 1 << 20
	c.MaxPollWait = 200 * time.Millisecond
	topic := testenv.Topic(t, c, "parallel-fetchmin", 3)
	_, ch := subscribe(t, c, uniqueGroup("parallel-fetchmin"), topic, kafkax.ParallelConfig{})
	for i, payload := range []string{"a/0", ""} {
		produce(t, c, topic, false, []rec{{-1, "a", payload}})
		m := receive(t, ch, 20*time.Second, "a record far below fetch_min_bytes")
		if string(m.Payload) != payload {
			t.Fatalf("record %d: got %q, want %q", i, m.Payload, payload)
		}
		m.Ack()
	}
	quiet(t, ch, 500*time.Millisecond, "after both records")
}

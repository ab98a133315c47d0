package kafkax

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Record is one message read back from a topic.
type Record struct {
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   map[string]string
	Timestamp time.Time // the record's Kafka timestamp
}

// ReadAll reads every committed record of topic from the oldest offset up to the high-water
// mark seen at the start. It reads with read_committed isolation, so it never returns
// aborted transactional writes. It is independent of any consumer group. Audits and tests
// use it.
func (c Config) ReadAll(ctx context.Context, topic string, idle time.Duration) ([]Record, error) {
	sc := c.base()
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Return.Errors = true
	sc.Consumer.MaxWaitTime = 100 * time.Millisecond
	client, err := sarama.NewClient(c.Brokers, sc)
	if err != nil {
		return nil, Unreachable(c.Brokers, err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("kafka topic %q: %w", topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	if idle <= 0 {
		idle = 2 * time.Second
	}
	// The offsets are looked up one partition after another. Sarama's first requests to a
	// broker it is still connecting to can fail with "broker not connected" when they race.
	type span struct{ oldest, hwm int64 }
	spans := make([]span, len(parts))
	for i, p := range parts {
		if spans[i].hwm, err = client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			return nil, fmt.Errorf("offset of %s/%d: %w", topic, p, err)
		}
		if spans[i].oldest, err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
			return nil, fmt.Errorf("offset of %s/%d: %w", topic, p, err)
		}
	}
	// The partitions are read at once. A partition whose last offsets are transaction
	// markers ends only after idle. Waiting that out partition after partition would make
	// audits of transactional topics take idle × partitions.
	results := make([][]Record, len(parts))
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = readPartition(ctx, consumer, topic, p, spans[i].oldest, spans[i].hwm, idle)
		}()
	}
	wg.Wait()
	var out []Record
	for i := range parts {
		if errs[i] != nil {
			return nil, errs[i]
		}
		out = append(out, results[i]...)
	}
	return out, nil
}

// readPartition reads partition p of topic from oldest to the high-water mark hwm seen at
// the start, or until idle passes without a record.
func readPartition(ctx context.Context, consumer sarama.Consumer, topic string, p int32, oldest, hwm int64, idle time.Duration) ([]Record, error) {
	if hwm <= oldest {
		return nil, nil
	}
	// The slice is sized from the offsets. Transaction markers and aborted records make that
	// a bound and not a count. Without it, a read-back of a large partition would copy its
	// records on every growth.
	out := make([]Record, 0, min(hwm-oldest, 1<<20))
	pc, err := consumer.ConsumePartition(topic, p, oldest)
	if err != nil {
		return nil, fmt.Errorf("consume %s/%d: %w", topic, p, err)
	}
	timer := time.NewTimer(idle)
loop:
	for {
		select {
		case m := <-pc.Messages():
			r := Record{Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: m.Value, Headers: make(map[string]string, len(m.Headers)), Timestamp: m.Timestamp}
			for _, h := range m.Headers {
				r.Headers[string(h.Key)] = string(h.Value)
			}
			out = append(out, r)
			if m.Offset+1 >= hwm {
				break loop
			}
			if !timer.Stop() {
				<-timer.C
			}
			timer.Reset(idle)
		case err := <-pc.Errors():
			_ = pc.Close()
			return nil, fmt.Errorf("consume %s/%d: %w", topic, p, err)
		case <-timer.C:
			// Only transaction markers or aborted records are left below the HWM.
			break loop
		case <-ctx.Done():
			_ = pc.Close()
			return nil, ctx.Err()
		}
	}
	timer.Stop()
	_ = pc.Close()
	return out, nil
}

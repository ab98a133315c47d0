package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// watcher is a live read_committed consumer of every partition of a topic, from the offsets
// it finds at start. It records the wall-clock time it first sees each key: when the event
// became visible to a read_committed consumer, which is what the latency runs measure (the
// event's own Kafka timestamp is taken before its transaction commits).
type watcher struct {
	mu     sync.Mutex
	seen   map[string]time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup
	client sarama.Client
}

func watch(kc kafkax.Config, topic string) (*watcher, error) {
	sc := kc.ConsumerConfig()
	sc.Consumer.MaxWaitTime = 20 * time.Millisecond
	client, err := sarama.NewClient(kc.Brokers, sc)
	if err != nil {
		return nil, err
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		client.Close()
		return nil, err
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		client.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{seen: map[string]time.Time{}, cancel: cancel, client: client}
	for _, p := range parts {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			w.close()
			return nil, err
		}
		pc, err := consumer.ConsumePartition(topic, p, off)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("watch %s/%d: %w", topic, p, err)
		}
		w.wg.Go(func() {
			defer pc.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-pc.Messages():
					now := time.Now()
					w.mu.Lock()
					if _, ok := w.seen[string(m.Key)]; !ok {
						w.seen[string(m.Key)] = now
					}
					w.mu.Unlock()
				case <-pc.Errors():
				}
			}
		})
	}
	return w, nil
}

func (w *watcher) at(key string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.seen[key]
	return t, ok
}

// count is how many distinct keys the watcher has seen.
func (w *watcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen)
}

// wait returns once the watcher has seen n distinct keys, or fails after limit.
func (w *watcher) wait(n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		w.mu.Lock()
		seen := len(w.seen)
		w.mu.Unlock()
		if seen >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out: a read_committed consumer saw %d of %d events", seen, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (w *watcher) close() {
	w.cancel()
	w.wg.Wait()
	w.client.Close()
}

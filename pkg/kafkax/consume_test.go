package kafkax_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestConsumeSettlesOffTheWorker runs Consume on a real broker with a deliverFunc shaped as
// engine.Batcher.Deliver's path: deliver waits for room in a short queue, and one worker
// takes from it and calls done. The records come in runs of 20 of one Kafka key, so
// an ack hands out the next record of its key on the subscriber's channel. Were done to settle on the worker, it
// would wait for the loop to read that record while the loop waits for the worker to make
// room: no record would arrive after the first few. Every record is delivered, each once,
// nacked ones again, and Consume returns nil once ctx ends.
func TestConsumeSettlesOffTheWorker(t *testing.T) {
	kc := testenv.Kafka(t)
	// On one P the worker, once it acks, runs on into the hand-out before the acked
	// message's watcher could take it over, as on a loaded machine.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	topic := testenv.Topic(t, kc, "consume-settle", 1)
	const n = 400
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	var batch []*sarama.ProducerMessage
	for i := range n {
		batch = append(batch, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("k%02d", i/20)),
			Value: sarama.StringEncoder(fmt.Sprintf("v%04d", i))})
	}
	if err := p.SendMessages(batch); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()

	sub, err := kc.NewParallelSubscriber("g-"+topic, kafkax.ParallelConfig{Window: 256}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	queue := make(chan func(), 2)
	stopWorker := make(chan struct{})
	var workerDone sync.WaitGroup
	workerDone.Go(func() {
		for {
			select {
			case f := <-queue:
				f()
			case <-stopWorker:
				return
			}
		}
	})
	defer func() { close(stopWorker); workerDone.Wait() }()

	var mu sync.Mutex
	acked := map[string]int{}
	var nacked atomic.Int32
	deliver := func(msg *message.Message, done func(error)) {
		v := string(msg.Payload)
		f := func() {
			if v == "v0007" && nacked.Add(1) == 1 { // nacked once: delivered again
				done(errors.New("a failed attempt"))
				return
			}
			mu.Lock()
			acked[v]++
			mu.Unlock()
			done(nil)
		}
		select {
		case queue <- f:
		case <-msg.Context().Done():
			done(msg.Context().Err())
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		ended <- kafkax.Consume(ctx, sub, topic, "test/"+topic, deliver, watermill.NopLogger{})
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		got := len(acked)
		mu.Unlock()
		if got == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records acked within a minute: the loop and the worker wait for each other", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("Consume after ctx ended: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Consume did not return after ctx ended")
	}
	mu.Lock()
	defer mu.Unlock()
	for v, c := range acked {
		if c != 1 {
			t.Errorf("record %s acked %d times", v, c)
		}
	}
	if nacked.Load() < 1 {
		t.Error("the nacked record was not delivered again")
	}
}

package kafkax_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// tlog forwards the subscriber's errors and infos to the test log.
type tlog struct {
	t      testing.TB
	fields watermill.LogFields
}

func (l tlog) Error(msg string, err error, f watermill.LogFields) {
	l.t.Logf("ERROR %s: %v %v", msg, err, l.fields.Add(f))
}
func (l tlog) Info(msg string, f watermill.LogFields) { l.t.Logf("INFO %s %v", msg, l.fields.Add(f)) }
func (l tlog) Debug(string, watermill.LogFields)      {}
func (l tlog) Trace(string, watermill.LogFields)      {}
func (l tlog) With(f watermill.LogFields) watermill.LoggerAdapter {
	return tlog{t: l.t, fields: l.fields.Add(f)}
}

func uniqueGroup(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// rec is one message to produce. Partition -1 lets the hash partitioner choose by key.
type rec struct {
	partition int32
	key       string
	payload   string
}

// produce writes recs in order with the project's idempotent producer settings, each with
// a fresh Watermill UUID and a "seq" metadata entry.
func produce(t *testing.T, c kafkax.Config, topic string, manual bool, recs []rec) {
	t.Helper()
	pcfg := c.ProducerConfig()
	if manual {
		pcfg.Producer.Partitioner = sarama.NewManualPartitioner
	}
	p, err := sarama.NewSyncProducer(c.Brokers, pcfg)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	pms := make([]*sarama.ProducerMessage, 0, len(recs))
	for i, r := range recs {
		m := message.NewMessage(watermill.NewUUID(), []byte(r.payload))
		m.Metadata.Set("seq", strconv.Itoa(i))
		pm, err := wkafka.DefaultMarshaler{}.Marshal(topic, m)
		if err != nil {
			t.Fatal(err)
		}
		if r.key != "" {
			pm.Key = sarama.StringEncoder(r.key)
		}
		pm.Partition = r.partition
		pms = append(pms, pm)
	}
	if err := p.SendMessages(pms); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func subscribe(t *testing.T, c kafkax.Config, group, topic string, pc kafkax.ParallelConfig) (*kafkax.ParallelSubscriber, <-chan *message.Message) {
	t.Helper()
	sub, err := c.NewParallelSubscriber(group, pc, tlog{t: t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return sub, ch
}

type pos struct {
	partition int32
	offset    int64
}

func keyOf(m *message.Message) string {
	k, _, _ := strings.Cut(string(m.Payload), "/")
	return k
}

// receive returns the next message, failing the test after timeout.
func receive(t *testing.T, ch <-chan *message.Message, timeout time.Duration, what string) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
		return m
	case <-time.After(timeout):
		t.Fatalf("%s: nothing received in %s", what, timeout)
	}
	return nil
}

// quiet fails if a message arrives within d.
func quiet(t *testing.T, ch <-chan *message.Message, d time.Duration, what string) {
	t.Helper()
	select {
	case m := <-ch:
		src := sourceOf(m)
		t.Fatalf("%s: unexpected message %q (%d bytes) at %d/%d", what, m.Payload[:min(len(m.Payload), 40)], len(m.Payload), src.Partition, src.Offset)
	case <-time.After(d):
	}
}

// TestParallelSubscriberKeyOrderWindowConcurrency acks from many goroutines in random order.
// It checks that every message arrives. Each key's messages are first handed out in
// production order and never two at once. No partition ever has more than Window un-acked
// messages. Every partition has more than one message in flight at some point, which
// watermill-kafka's subscriber never has.
func TestParallelSubscriberKeyOrderWindowConcurrency(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-order", 3)
	const (
		total  = 2000
		keys   = 50
		window = 8
	)
	var recs []rec
	nextSeq := map[string]int{}
	for i := 0; i < total; i++ {
		key := ""
		if mrand.IntN(4) != 0 { // a quarter without key
			key = fmt.Sprintf("k%02d", mrand.IntN(keys))
		}
		recs = append(recs, rec{partition: -1, key: key, payload: fmt.Sprintf("%s/%d", key, nextSeq[key])})
		nextSeq[key]++
	}
	produce(t, c, topic, false, recs)

	_, ch := subscribe(t, c, uniqueGroup("parallel-order"), topic, kafkax.ParallelConfig{Window: window})

	var (
		mu          sync.Mutex
		seen        = map[pos]bool{}
		firstOrder  = map[string][]int{} // key -> seq in order of first hand-out
		unacked     = map[int32]int{}
		maxUnacked  = map[int32]int{}
		keyInFlight = map[string]pos{}
		failures    []string
		acks        sync.WaitGroup
	)
	fail := func(format string, a ...any) {
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, a...))
		}
	}
	deadline := time.After(45 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == total {
			break
		}
		var m *message.Message
		select {
		case m = <-ch:
		case <-deadline:
			t.Fatalf("received %d of %d distinct messages before the deadline", n, total)
		}
		src := sourceOf(m)
		key := keyOf(m)
		seq, _ := strconv.Atoi(strings.SplitN(string(m.Payload), "/", 2)[1])
		p := pos{src.Partition, src.Offset}

		mu.Lock()
		if src.Topic != topic {
			fail("source topic %q, want %q", src.Topic, topic)
		}
		if m.UUID == "" || m.Metadata.Get("seq") == "" {
			fail("message %q lost its UUID or metadata: %q %v", m.Payload, m.UUID, m.Metadata)
		}
		if key != "" {
			if other, busy := keyInFlight[key]; busy {
				fail("key %s: %d/%d handed out while %d/%d is un-acked", key, p.partition, p.offset, other.partition, other.offset)
			}
			keyInFlight[key] = p
		}
		if !seen[p] {
			seen[p] = true
			firstOrder[key] = append(firstOrder[key], seq)
		}
		unacked[p.partition]++
		if unacked[p.partition] > maxUnacked[p.partition] {
			maxUnacked[p.partition] = unacked[p.partition]
		}
		if unacked[p.partition] > window {
			fail("partition %d: %d un-acked messages, window %d", p.partition, unacked[p.partition], window)
		}
		mu.Unlock()

		acks.Add(1)
		go func() {
			defer acks.Done()
			time.Sleep(time.Duration(mrand.IntN(3000)) * time.Microsecond)
			mu.Lock()
			unacked[p.partition]--
			if key != "" {
				delete(keyInFlight, key)
			}
			mu.Unlock()
			m.Ack()
		}()
	}
	acks.Wait()

	mu.Lock()
	defer mu.Unlock()
	for _, f := range failures {
		t.Error(f)
	}
	for key, seqs := range firstOrder {
		if key == "" {
			continue
		}
		for i, s := range seqs {
			if s != i {
				t.Errorf("key %s: first hand-outs in order %v, want 0..%d", key, seqs, len(seqs)-1)
				break
			}
		}
	}
	for p := int32(0); p < 3; p++ {
		if maxUnacked[p] < 2 {
			t.Errorf("partition %d: at most %d message in flight at once, want > 1", p, maxUnacked[p])
		}
	}
	t.Logf("max un-acked per partition (window %d): %v", window, maxUnacked)
}

// TestParallelSubscriberWindowAndKeyBlocking checks the hand-out rules exactly on one
// partition without acking. A message whose key is busy waits in its place in the window
// while later messages of other keys go out. The window caps what is handed out.
func TestParallelSubscriberWindowAndKeyBlocking(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-window", 1)
	recs := []rec{
		{0, "a", "a/0"}, {0, "b", "b/0"}, {0, "", "/0"}, {0, "a", "a/1"}, // a/1 waits for a/0
		{0, "c", "c/0"}, {0, "", "/1"}, {0, "d", "d/0"}, {0, "e", "e/0"}, {0, "f", "f/0"},
	}
	produce(t, c, topic, true, recs)
	_, ch := subscribe(t, c, uniqueGroup("parallel-window"), topic, kafkax.ParallelConfig{Window: 5})

	got := map[string]*message.Message{}
	take := func(want ...string) {
		t.Helper()
		for _, w := range want {
			m := receive(t, ch, 20*time.Second, "want "+w)
			if string(m.Payload) != w {
				t.Fatalf("got %q, want %q", m.Payload, w)
			}
			got[w] = m
		}
	}
	// takeAny receives len(want) messages in any order. The messages one ack releases are
	// handed out concurrently, by a waiting key and by the window's new room.
	takeAny := func(want ...string) {
		t.Helper()
		left := map[string]bool{}
		for _, w := range want {
			left[w] = true
		}
		for range want {
			m := receive(t, ch, 20*time.Second, fmt.Sprintf("want one of %v", left))
			if !left[string(m.Payload)] {
				t.Fatalf("got %q, want one of %v", m.Payload, left)
			}
			delete(left, string(m.Payload))
			got[string(m.Payload)] = m
		}
	}
	// a/1 waits for a/0 in its place in the window, and the messages after it go out.
	take("a/0", "b/0", "/0", "c/0")
	quiet(t, ch, 1500*time.Millisecond, "a/1 must wait for a/0, and the window of 5 is full")
	got["b/0"].Ack() // unrelated key, not the oldest: a/1 still waits, the window is still full
	quiet(t, ch, 500*time.Millisecond, "a/1 must wait for a/0 after b/0's ack")
	got["a/0"].Ack()
	// The queue is now /0, a/1, c/0, /1 and d/0. These five are un-acked, and b/0 and a/0
	// were committed.
	takeAny("a/1", "/1", "d/0")
	quiet(t, ch, 1500*time.Millisecond, "window of 5 is full")
	got["d/0"].Ack() // not the oldest: the window spans from the oldest un-acked message
	quiet(t, ch, 500*time.Millisecond, "window still full after acking its newest message")
	got["/0"].Ack()
	take("e/0")
	quiet(t, ch, 500*time.Millisecond, "window full again")
	for _, w := range []string{"a/1", "c/0", "/1", "e/0"} {
		got[w].Ack()
	}
	take("f/0")
	got["f/0"].Ack()
}

// TestParallelSubscriberCommitsOnlyContiguousAcks acks everything but one early message,
// closes, and checks that a new member of the group gets exactly that message and the rest
// of its partition again, and nothing that was acked before it.
func TestParallelSubscriberCommitsOnlyContiguousAcks(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-offsets", 2)
	const perPartition = 30
	var recs []rec
	for i := 0; i < perPartition; i++ {
		for p := int32(0); p < 2; p++ {
			key := ""
			if i%3 != 0 {
				key = fmt.Sprintf("k%d-%d", p, i)
			}
			recs = append(recs, rec{p, key, fmt.Sprintf("%s/%d", key, i)})
		}
	}
	produce(t, c, topic, true, recs)
	held := pos{0, 10}

	// With its acks past the committed offset in the commit's metadata (the default), the
	// next subscriber hands out only the message never acked. Without the metadata the
	// committed offset alone stops at it, and every acked message past it comes again: the
	// copies the metadata saves.
	for _, tc := range []struct {
		name     string
		metadata bool
		again    int
	}{
		{"acked past the offset in its metadata", true, 1},
		{"the offset alone", false, perPartition - int(held.offset)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := uniqueGroup("parallel-offsets")
			sub := func() (*kafkax.ParallelSubscriber, <-chan *message.Message) {
				sub, err := c.NewParallelSubscriber(group, kafkax.ParallelConfig{}, tlog{t: t})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Close() })
				if !tc.metadata {
					kafkax.WithoutAckedMetadata(sub)
				}
				ch, err := sub.Subscribe(context.Background(), topic)
				if err != nil {
					t.Fatal(err)
				}
				return sub, ch
			}
			sub1, ch1 := sub()
			msgs := map[pos]*message.Message{}
			for len(msgs) < 2*perPartition {
				m := receive(t, ch1, 20*time.Second, fmt.Sprintf("first subscriber, %d received", len(msgs)))
				src := sourceOf(m)
				msgs[pos{src.Partition, src.Offset}] = m
			}
			if msgs[held] == nil {
				t.Fatalf("no message at %v: offsets are not 0..%d", held, perPartition-1)
			}
			// Ack newest first, so nothing is contiguous until the very end of each partition.
			for off := int64(perPartition - 1); off >= 0; off-- {
				for p := int32(0); p < 2; p++ {
					if (pos{p, off}) != held {
						msgs[pos{p, off}].Ack()
					}
				}
			}
			if err := sub1.Close(); err != nil {
				t.Fatal(err)
			}
			if _, ok := <-ch1; ok {
				t.Fatal("channel still open after Close")
			}
			if lag := testenv.CommittedLag(t, c, group, topic); lag[0] != perPartition-held.offset || lag[1] != 0 {
				t.Fatalf("committed lag %v, want partition 0 at its un-acked message %d and 1 at its end", lag, held.offset)
			}

			sub2, ch2 := sub()
			again := map[int64]bool{}
			for len(again) < tc.again {
				m := receive(t, ch2, 20*time.Second, "redelivery")
				src := sourceOf(m)
				if src.Partition != held.partition || src.Offset < held.offset {
					t.Fatalf("redelivered %d/%d (%q), which was acked before %v", src.Partition, src.Offset, m.Payload, held)
				}
				if want := msgs[pos{src.Partition, src.Offset}]; want.UUID != m.UUID {
					t.Fatalf("redelivered %d/%d with UUID %s, first delivery had %s", src.Partition, src.Offset, m.UUID, want.UUID)
				}
				again[src.Offset] = true
				m.Ack()
			}
			if !again[held.offset] {
				t.Fatalf("the un-acked message was not redelivered")
			}
			quiet(t, ch2, 2*time.Second, "after the redelivered tail")
			if got, want := sub2.SkippedAcked(), int64(perPartition-int(held.offset)-tc.again); got != want {
				t.Fatalf("SkippedAcked %d, want %d", got, want)
			}
			// Nothing lost: the skipped messages count as acked, so the offset reaches the end.
			if err := sub2.Close(); err != nil {
				t.Fatal(err)
			}
			if lag := testenv.CommittedLag(t, c, group, topic); lag[0] != 0 || lag[1] != 0 {
				t.Fatalf("committed lag %v after the second subscriber acked everything, want 0", lag)
			}
		})
	}
}

// TestParallelSubscriberNackRedelivers nacks a message and checks that it comes back as the
// same message and keeps its key, so a later message of that key waits. It does not hold up
// other keys.
func TestParallelSubscriberNackRedelivers(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-nack", 1)
	produce(t, c, topic, true, []rec{{0, "x", "x/0"}, {0, "y", "y/0"}, {0, "", "/0"}, {0, "x", "x/1"}})
	group := uniqueGroup("parallel-nack")
	sub, ch := subscribe(t, c, group, topic, kafkax.ParallelConfig{NackResendSleep: 50 * time.Millisecond})

	first := receive(t, ch, 20*time.Second, "x/0")
	if string(first.Payload) != "x/0" {
		t.Fatalf("got %q first, want x/0", first.Payload)
	}
	firstSrc := sourceOf(first)
	first.Nack()

	var redelivered *message.Message
	others := map[string]*message.Message{}
	for redelivered == nil || len(others) < 2 {
		m := receive(t, ch, 20*time.Second, "redelivery of x/0, and y/0, /0")
		switch string(m.Payload) {
		case "x/0":
			if redelivered != nil {
				t.Fatal("x/0 redelivered twice without a second nack")
			}
			redelivered = m
		case "x/1":
			t.Fatal("x/1 handed out while x/0 is un-acked")
		default:
			others[string(m.Payload)] = m
		}
	}
	if redelivered == first {
		t.Fatal("redelivery reused the nacked *message.Message")
	}
	if redelivered.UUID != first.UUID || redelivered.Metadata.Get("seq") != first.Metadata.Get("seq") {
		t.Fatalf("redelivered %s %v, first %s %v", redelivered.UUID, redelivered.Metadata, first.UUID, first.Metadata)
	}
	if src := sourceOf(redelivered); src != firstSrc || src.Topic != topic || src.Offset != 0 {
		t.Fatalf("redelivered source %+v, first %+v", src, firstSrc)
	}
	if others["y/0"] == nil || others["/0"] == nil {
		t.Fatalf("y/0 and /0 not both handed out while x/0 was nacked: %v", others)
	}
	quiet(t, ch, 500*time.Millisecond, "x/1 waits for x/0's ack")
	for _, m := range others {
		m.Ack()
	}
	redelivered.Ack()
	last := receive(t, ch, 20*time.Second, "x/1")
	if string(last.Payload) != "x/1" {
		t.Fatalf("got %q, want x/1", last.Payload)
	}
	last.Ack()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}

	// Everything was acked, so a new member of the group gets nothing.
	_, ch2 := subscribe(t, c, group, topic, kafkax.ParallelConfig{})
	quiet(t, ch2, 3*time.Second, "after everything was acked")
}

// TestParallelSubscriberRebalance starts a second member of the group while the first is
// consuming with acks in flight. Every message is delivered. Each key's messages are still
// first handed out in production order. The acks the first member makes while its claims
// drain are committed, so there are few or no duplicates.
func TestParallelSubscriberRebalance(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "parallel-rebalance", 4)
	const total = 3000
	var recs []rec
	nextSeq := map[string]int{}
	for i := 0; i < total; i++ {
		key := fmt.Sprintf("k%02d", mrand.IntN(40))
		recs = append(recs, rec{partition: -1, key: key, payload: fmt.Sprintf("%s/%d", key, nextSeq[key])})
		nextSeq[key]++
	}
	produce(t, c, topic, false, recs)
	group := uniqueGroup("parallel-rebalance")

	var (
		mu         sync.Mutex
		seen       = map[pos]bool{}
		firstOrder = map[string][]int{}
		deliveries = 0
		perMember  = [2]int{}
		acks       atomic.Int64 // acks not made yet (a WaitGroup's Add may not race its Wait)
	)
	all := make(chan struct{})
	consume := func(member int, ch <-chan *message.Message) {
		for m := range ch {
			src := sourceOf(m)
			k, s, _ := strings.Cut(string(m.Payload), "/")
			seq, _ := strconv.Atoi(s)
			p := pos{src.Partition, src.Offset}
			mu.Lock()
			deliveries++
			perMember[member]++
			if !seen[p] {
				seen[p] = true
				firstOrder[k] = append(firstOrder[k], seq)
				if len(seen) == total {
					close(all)
				}
			}
			mu.Unlock()
			acks.Add(1)
			go func() {
				defer acks.Add(-1)
				time.Sleep(time.Duration(5+mrand.IntN(10)) * time.Millisecond)
				m.Ack()
			}()
		}
	}
	var consumers sync.WaitGroup
	subA, chA := subscribe(t, c, group, topic, kafkax.ParallelConfig{Window: 16})
	consumers.Add(1)
	go func() { defer consumers.Done(); consume(0, chA) }()
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= total/10 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	subB, chB := subscribe(t, c, group, topic, kafkax.ParallelConfig{Window: 16})
	consumers.Add(1)
	go func() { defer consumers.Done(); consume(1, chB) }()

	select {
	case <-all:
	case <-time.After(45 * time.Second):
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		t.Fatalf("received %d of %d distinct messages before the deadline", n, total)
	}
	for acks.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	_ = subA.Close()
	_ = subB.Close()
	consumers.Wait()

	mu.Lock()
	defer mu.Unlock()
	for key, seqs := range firstOrder {
		for i, s := range seqs {
			if s != i {
				t.Errorf("key %s: first hand-outs in order %v, want 0..%d", key, seqs, len(seqs)-1)
				break
			}
		}
	}
	if perMember[1] == 0 {
		t.Errorf("the second member got nothing: no rebalance happened")
	}
	// Acks come within 15ms, far inside the drain grace. So every ack made while a claim
	// drained is committed before the partition moves, and nothing is delivered twice.
	if deliveries != total {
		t.Errorf("%d deliveries for %d messages: the drained claims' acks were not committed", deliveries, total)
	}
	t.Logf("deliveries %d for %d messages (%d redelivered); per member %v", deliveries, total, deliveries-total, perMember)
}

// sourceOf is where the subscriber says m came from. It is the source that m's context
// carries for the inbox's engine.SourceOf.
func sourceOf(m *message.Message) msgsource.Source {
	s, _ := msgsource.From(m.Context())
	return s
}

package kafkax_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestConfigBalanceStrategies checks kafka.balance_strategies. It defaults to
// cooperative-sticky alone. It takes range, and both for the first step of a rolling change.
// It refuses an empty list, an unknown name and a name listed twice. Each consumer config
// gets strategy instances of its own, because Sarama's cooperative-sticky one keeps state of
// its group.
func TestConfigBalanceStrategies(t *testing.T) {
	c := kafkax.Config{Brokers: []string{"127.0.0.1:9092"}}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.BalanceStrategies, []string{"cooperative-sticky"}) || !c.Cooperative() {
		t.Fatalf("default balance strategies %q, cooperative %t; want [cooperative-sticky], true", c.BalanceStrategies, c.Cooperative())
	}
	names := func(sc *sarama.Config) []string {
		var out []string
		for _, s := range sc.Consumer.Group.Rebalance.GroupStrategies {
			out = append(out, s.Name())
		}
		return out
	}
	a, b := c.ConsumerConfig(), c.ConsumerConfig()
	if got := names(a); !slices.Equal(got, []string{"cooperative-sticky"}) {
		t.Fatalf("consumer config strategies %q", got)
	}
	if a.Consumer.Group.Rebalance.GroupStrategies[0] == b.Consumer.Group.Rebalance.GroupStrategies[0] {
		t.Fatal("two consumer configs share one cooperative-sticky instance")
	}
	if err := a.Validate(); err != nil {
		t.Fatalf("Sarama refuses the consumer config: %v", err)
	}
	for _, ok := range [][]string{{"range"}, {"cooperative-sticky", "range"}, {"range", "cooperative-sticky"}} {
		c.BalanceStrategies = ok
		if err := c.Validate(); err != nil {
			t.Fatalf("%q refused: %v", ok, err)
		}
		if c.Cooperative() {
			t.Fatalf("%q reported cooperative: a list with range rebalances eagerly", ok)
		}
		if got := names(c.ConsumerConfig()); !slices.Equal(got, ok) {
			t.Fatalf("%q: consumer config strategies %q", ok, got)
		}
	}
	for _, bad := range [][]string{{"sticky"}, {"cooperative-sticky", "cooperative-sticky"}, {""}} {
		c.BalanceStrategies = bad
		if err := c.Validate(); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// claimLog records a subscriber's claims from its "Partition claimed" and "Partition claim
// done" log lines: how often each partition's claim started and ended.
type claimLog struct {
	watermill.LoggerAdapter
	mu            sync.Mutex
	started, done map[int32]int
}

func newClaimLog(t *testing.T) *claimLog {
	return &claimLog{LoggerAdapter: tlog{t: t}, started: map[int32]int{}, done: map[int32]int{}}
}

func (l *claimLog) Debug(msg string, f watermill.LogFields) {
	p, ok := f["kafka_partition"].(int32)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch msg {
	case "Partition claimed":
		l.started[p]++
	case "Partition claim done":
		l.done[p]++
	}
}

func (l *claimLog) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// ended is how often the claims of partitions ps ended.
func (l *claimLog) ended(ps []int32) map[int32]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int32]int{}
	for _, p := range ps {
		if n := l.done[p]; n > 0 {
			out[p] = n
		}
	}
	return out
}

// partitionsOf are the partitions sub claims now.
func partitionsOf(sub *kafkax.ParallelSubscriber) []int32 {
	var ps []int32
	for _, s := range sub.PartitionStats() {
		ps = append(ps, s.Partition)
	}
	return ps
}

// joinLeave is what joinAndLeave saw.
type joinLeave struct {
	kept     []int32       // A's partitions before B joined that A still had with B in the group
	ended    map[int32]int // how often A's claims of those ended while A ran
	produced int
}

// joinAndLeave runs a group with strategies on a topic of 6 partitions that a producer
// writes to all along. Member A consumes alone, then member B joins, both consume, and B
// leaves. Then the producer stops and A finishes. It fails the test unless every record is
// handled, none that A acked is handed out again, and the group's committed offsets reach
// the end of every partition. (B's Close, like any Close, drops the acks that race it.) It reports which partitions A kept through B's stay and how
// often their claims ended.
func joinAndLeave(t *testing.T, strategies []string) joinLeave {
	c := testenv.Kafka(t)
	c.BalanceStrategies = strategies
	const parts = 6
	topic := testenv.Topic(t, c, "parallel-coop", parts)
	group := uniqueGroup("parallel-coop")

	var (
		mu        sync.Mutex
		delivered = map[pos]int{}
		acked     = map[pos]string{} // the member that acked the record
		again     []string           // records handed out again after A acked them
		afterB    int                // records handed out again after B acked them
		pending   atomic.Int64
	)
	consume := func(name string, ch <-chan *message.Message) {
		for m := range ch {
			src := sourceOf(m)
			p := pos{src.Partition, src.Offset}
			mu.Lock()
			delivered[p]++
			switch acked[p] {
			case "A":
				if len(again) < 20 {
					again = append(again, fmt.Sprintf("%s got %d/%d again after A acked it", name, p.partition, p.offset))
				}
			case "B":
				// B's Close does not wait for acks: one racing it is dropped, and the record
				// comes again.
				afterB++
			}
			mu.Unlock()
			pending.Add(1)
			go func() {
				defer pending.Add(-1)
				time.Sleep(time.Duration(1+p.offset%5) * time.Millisecond)
				mu.Lock()
				acked[p] = name // before the ack, so that a redelivery after it is always seen
				mu.Unlock()
				m.Ack()
			}()
		}
	}
	start := func(name string, log watermill.LoggerAdapter) (*kafkax.ParallelSubscriber, func()) {
		sub, err := c.NewParallelSubscriber(group, kafkax.ParallelConfig{Window: 64}, log)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := sub.Subscribe(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); consume(name, ch) }()
		var once sync.Once
		stop := func() { once.Do(func() { _ = sub.Close(); <-done }) }
		t.Cleanup(stop)
		return sub, stop
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s", what)
			}
		}
	}

	// The producer: 20 records every 10 ms, keyed, spread over the partitions by key.
	var produced atomic.Int64
	stopProducing := make(chan struct{})
	producing := make(chan struct{})
	p, err := sarama.NewSyncProducer(c.Brokers, c.ProducerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go func() {
		defer close(producing)
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				return
			case <-time.After(10 * time.Millisecond):
			}
			var batch []*sarama.ProducerMessage
			for j := range 20 {
				k := fmt.Sprintf("k%03d", (i*20+j)%300)
				batch = append(batch, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(fmt.Sprintf("%s/%d", k, i))})
			}
			if err := p.SendMessages(batch); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			produced.Add(int64(len(batch)))
		}
	}()

	logA := newClaimLog(t)
	subA, stopA := start("A", logA)
	waitFor("A claims every partition", func() bool { return len(partitionsOf(subA)) == parts })
	before := partitionsOf(subA)
	time.Sleep(time.Second)

	subB, stopB := start("B", tlog{t: t, fields: watermill.LogFields{"member": "B"}})
	waitFor("B claims partitions, and A gives them up", func() bool {
		a, b := partitionsOf(subA), partitionsOf(subB)
		return len(b) > 0 && len(a)+len(b) == parts
	})
	var kept []int32
	for _, q := range partitionsOf(subA) {
		if slices.Contains(before, q) {
			kept = append(kept, q)
		}
	}
	time.Sleep(2 * time.Second)
	stopB()
	waitFor("A claims every partition again once B left", func() bool { return len(partitionsOf(subA)) == parts })
	time.Sleep(time.Second)
	ended := logA.ended(kept) // before A's own Close ends them all
	close(stopProducing)
	<-producing
	n := int(produced.Load())
	waitFor(fmt.Sprintf("all %d records handled and acked", n), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) >= n && pending.Load() == 0
	})
	waitFor("the committed offsets reach the end of every partition", func() bool {
		time.Sleep(200 * time.Millisecond) // a client per look: not every 20 ms
		for _, l := range testenv.CommittedLag(t, c, group, topic) {
			if l != 0 {
				return false
			}
		}
		return true
	})
	stopA()

	mu.Lock()
	defer mu.Unlock()
	for _, a := range again {
		t.Error(a)
	}
	if len(delivered) != n {
		t.Errorf("%d distinct records handed out, %d produced", len(delivered), n)
	}
	twice := 0
	for _, k := range delivered {
		twice += k - 1
	}
	t.Logf("%s: %d records, %d handed out again (%d of them acked by B as it closed); A kept %v of %v through B's stay; A's claims of those ended %v",
		strategies, n, twice, afterB, kept, before, ended)
	return joinLeave{kept: kept, ended: ended, produced: n}
}

// TestParallelSubscriberCooperativeJoinLeave checks incremental cooperative rebalancing with
// kafka.balance_strategies at its default. While member A consumes, member B joins and then
// leaves. The partitions A keeps are never revoked: their claims run on through both
// rebalances. Every record is handled, none that A acked is handed out again, and the
// committed offsets reach the end of every partition. The same check with range (eager)
// sees A's kept partitions revoked, so it can fail.
func TestParallelSubscriberCooperativeJoinLeave(t *testing.T) {
	t.Run("cooperative-sticky", func(t *testing.T) {
		got := joinAndLeave(t, []string{"cooperative-sticky"})
		if len(got.kept) == 0 {
			t.Fatal("A kept no partition while B was in the group")
		}
		if len(got.ended) > 0 {
			t.Fatalf("A's claims of partitions it kept ended (partition: times) %v: the rebalances revoked them", got.ended)
		}
	})
	t.Run("range", func(t *testing.T) {
		got := joinAndLeave(t, []string{"range"})
		if len(got.kept) == 0 {
			t.Fatal("A kept no partition while B was in the group")
		}
		if len(got.ended) == 0 {
			t.Fatalf("A's claims of partitions %v never ended under range: the check cannot see an eager revocation", got.kept)
		}
	})
}

// TestSubscriberJoinsCooperativeGroup runs watermill-kafka's subscriber, the subscriber of
// kafka.window 1, in a group whose other member is a ParallelSubscriber with the default
// cooperative-sticky strategy, as during a rolling change of kafka.window. While A, the
// ParallelSubscriber, consumes, B, watermill-kafka's, joins and then leaves. B joins (it
// offers range too, and rebalances eagerly), every record is handled, none that A acked is
// handed out again, and the committed offsets reach the end of every partition.
func TestSubscriberJoinsCooperativeGroup(t *testing.T) {
	c := testenv.Kafka(t)
	topic := testenv.Topic(t, c, "wkafka-coop", 4)
	group := uniqueGroup("wkafka-coop")
	recs := func(from, n int) []rec {
		var out []rec
		for i := from; i < from+n; i++ {
			k := fmt.Sprintf("k%03d", i%97)
			out = append(out, rec{partition: -1, key: k, payload: fmt.Sprintf("%s/%d", k, i)})
		}
		return out
	}
	produce(t, c, topic, false, recs(0, 600))

	var (
		mu      sync.Mutex
		seen    = map[pos]int{}
		ackedA  = map[pos]bool{}
		again   []string
		members = map[string]int{}
	)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	handle := func(name string, m *message.Message, p pos) {
		mu.Lock()
		seen[p]++
		members[name]++
		if ackedA[p] && len(again) < 20 {
			again = append(again, fmt.Sprintf("%s got %d/%d again after A acked it", name, p.partition, p.offset))
		}
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		if name == "A" {
			mu.Lock()
			ackedA[p] = true
			mu.Unlock()
		}
		m.Ack()
	}
	run := func(sub message.Subscriber, name string, posOf func(*message.Message) pos) func() {
		ch, err := sub.Subscribe(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			var wg sync.WaitGroup
			for m := range ch {
				wg.Go(func() { handle(name, m, posOf(m)) })
			}
			wg.Wait()
		}()
		var once sync.Once
		stop := func() { once.Do(func() { _ = sub.Close(); <-done }) }
		t.Cleanup(stop)
		return stop
	}
	wait := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s (%d records seen)", what, count())
			}
		}
	}
	subA, err := c.NewParallelSubscriber(group, kafkax.ParallelConfig{Window: 16}, tlog{t: t, fields: watermill.LogFields{"member": "A"}})
	if err != nil {
		t.Fatal(err)
	}
	run(subA, "A", func(m *message.Message) pos { src := sourceOf(m); return pos{src.Partition, src.Offset} })
	wait("A handles records", func() bool { return count() >= 100 })
	subB, err := c.NewSubscriber(group, tlog{t: t, fields: watermill.LogFields{"member": "B"}})
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(subB, "B", func(m *message.Message) pos {
		partition, _ := wkafka.MessagePartitionFromCtx(m.Context())
		offset, _ := wkafka.MessagePartitionOffsetFromCtx(m.Context())
		return pos{partition, offset}
	})
	total := 600
	wait("B, watermill-kafka's, joins and handles records", func() bool {
		produce(t, c, topic, false, recs(total, 40)) // A handled the first 600 long ago
		total += 40
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return members["B"] >= 20
	})
	stopB()
	produce(t, c, topic, false, recs(total, 300))
	total += 300
	wait("every record handled", func() bool { return count() == total })
	wait("the committed offsets reach the end of every partition", func() bool {
		time.Sleep(200 * time.Millisecond) // a client per look: not every 20 ms
		for _, l := range testenv.CommittedLag(t, c, group, topic) {
			if l != 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for _, a := range again {
		t.Error(a)
	}
	twice := 0
	for _, k := range seen {
		twice += k - 1
	}
	t.Logf("%d records, %d handed out again; per member %v", total, twice, members)
}

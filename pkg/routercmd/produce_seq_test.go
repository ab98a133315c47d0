package routercmd

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
)

// legacyProduce is how `produce` chose its records before it streamed them, kept verbatim.
// It builds every message in memory, shuffles them in a window of 50 and inserts poison at
// random places. It is the reference that the streamed sequence must equal.
func legacyProduce(p inbox.Plugin, o produceOpts, kinds []poisonKind) []record {
	rng := rand.New(rand.NewPCG(o.seed, 7))
	var msgs []record
	for i := range o.orders {
		key := fmt.Sprintf("%s-%06d", o.prefix, i)
		value := p.Sampler.Sample(key, i, rng)
		msgs = append(msgs, keyRecord(key, value))
		if rng.Float64() < o.dupRate {
			msgs = append(msgs, keyRecord(key, value))
		}
	}
	for i := range msgs {
		j := i + rng.IntN(min(len(msgs)-i, 50))
		if string(msgs[i].key) != string(msgs[j].key) {
			msgs[i], msgs[j] = msgs[j], msgs[i]
		}
	}
	for i := range o.poison {
		r := kinds[i%len(kinds)].record(o.prefix, i)
		pos := rng.IntN(len(msgs) + 1)
		msgs = append(msgs[:pos], append([]record{r}, msgs[pos:]...)...)
	}
	return msgs
}

// hashRecord adds what a record means to h. That is its key, its value and its headers, but
// not the message id, which is random. A tombstone hashes apart from an empty value.
func hashRecord(h hash.Hash, r record) {
	fmt.Fprintf(h, "k%q ", r.key)
	if r.value == nil {
		fmt.Fprint(h, "tombstone ")
	} else {
		fmt.Fprintf(h, "v%q ", r.value)
	}
	for _, hd := range r.headers {
		if string(hd.Key) == wkafka.UUIDHeaderKey {
			continue
		}
		fmt.Fprintf(h, "h%q=%q ", hd.Key, hd.Value)
	}
	fmt.Fprintln(h)
}

func digest(rs []record) string {
	h := sha256.New()
	for _, r := range rs {
		hashRecord(h, r)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// produceCases are runs whose sequences are pinned. They use the coupon granter's Sample
// and Poison. Some runs have duplicates and poison, and some do not. One has fewer orders
// than the shuffle window, and one has more poison than orders.
var produceCases = []struct {
	o    produceOpts
	want string // digest of the sequence as legacyProduce, the in-memory reference, builds it
}{
	{produceOpts{orders: 1000, dupRate: 0.3, seed: 1, prefix: "ord"}, "a8597a10fcc4a692"},
	{produceOpts{orders: 1000, dupRate: 0.3, poison: 17, seed: 42, prefix: "ord"}, "19e2897e654acfc5"},
	{produceOpts{orders: 30, dupRate: 1, poison: 3, seed: 7, prefix: "p"}, "df042b988b055205"},
	{produceOpts{orders: 200, dupRate: 0, seed: 3, prefix: "p"}, "7f7d598cb4cdbd09"},
	{produceOpts{orders: 5, dupRate: 0.5, poison: 40, seed: 9, prefix: "x"}, "5b6e5c78c43abfcb"},
	{produceOpts{orders: 0, poison: 2, seed: 1, prefix: "z"}, "f77f0f1b30ab5218"},
	{produceOpts{orders: 4000, dupRate: 0.3, poison: 8, seed: 2026, prefix: "demo"}, "203f583acf52c684"},
}

// streamed is every record of a produce run's sequence, as produce sends them.
func streamed(p inbox.Plugin, o produceOpts, kinds []poisonKind) ([]record, int) {
	s := newProduceSeq(p, o, kinds)
	var out []record
	for {
		r, ok := s.next()
		if !ok {
			return out, s.deliveries
		}
		out = append(out, r)
	}
}

// sameSequence compares two sequences record by record, leaving the message ids aside.
func sameSequence(t *testing.T, what string, got, want []record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := sha256.New(), sha256.New()
		hashRecord(g, got[i])
		hashRecord(w, want[i])
		if string(g.Sum(nil)) != string(w.Sum(nil)) {
			t.Fatalf("%s: record %d is key %q value %.40q, want key %q value %.40q", what, i, got[i].key, got[i].value, want[i].key, want[i].value)
		}
	}
}

// TestProduceSequencePinned checks that the sequence `produce --seed` sends is the one it
// sent when it built every message in memory. It has the same keys, values, duplicates and
// poison in the same order. The digests were taken from that implementation.
func TestProduceSequencePinned(t *testing.T) {
	granter, _ := registered().Get(coupon.PluginName)
	kinds, _ := poisonKinds(granter, 256<<10, 1_000_000)
	for _, c := range produceCases {
		legacy := legacyProduce(granter, c.o, kinds)
		if got := digest(legacy); got != c.want {
			t.Errorf("%+v: reference digest %s, want %s", c.o, got, c.want)
		}
		got, deliveries := streamed(granter, c.o, kinds)
		sameSequence(t, fmt.Sprintf("%+v", c.o), got, legacy)
		if d := digest(got); d != c.want {
			t.Errorf("%+v: streamed digest %s, want %s", c.o, d, c.want)
		}
		if deliveries != len(got)-c.o.poison {
			t.Errorf("%+v: %d deliveries counted, %d order records sent", c.o, deliveries, len(got)-c.o.poison)
		}
	}
}

// greedySampler draws a varying number of values per order.
type greedySampler struct{}

func (greedySampler) Sample(key string, seq int, rng *rand.Rand) []byte {
	n := rng.IntN(4)
	for range n {
		rng.Uint64()
	}
	return []byte(fmt.Sprintf("%s/%d/%d", key, seq, n))
}

// TestProduceSequenceStreamsTheReference checks that the streamed sequence equals the
// reference for random runs. That holds also for a Sampler that draws a varying number of
// values. The shuffle's draws start where the last order's draws left the source.
func TestProduceSequenceStreamsTheReference(t *testing.T) {
	granter, _ := registered().Get(coupon.PluginName)
	kinds, _ := poisonKinds(granter, 256<<10, 1_000_000)
	greedy := granter
	greedy.Sampler = greedySampler{}
	r := rand.New(rand.NewPCG(5, 5))
	for i := range 300 {
		o := produceOpts{orders: r.IntN(400), dupRate: []float64{0, 0.3, 1, r.Float64()}[i%4], poison: r.IntN(30) * (i % 2),
			seed: r.Uint64(), prefix: "r"}
		p := granter
		if i%3 == 0 {
			p = greedy
		}
		got, _ := streamed(p, o, kinds)
		sameSequence(t, fmt.Sprintf("%+v", o), got, legacyProduce(p, o, kinds))
	}
}

// TestProduceSequenceIsBounded checks that, however many orders a run has, the sequence
// holds no more than the shuffle's window of them at a time.
func TestProduceSequenceIsBounded(t *testing.T) {
	granter, _ := registered().Get(coupon.PluginName)
	kinds, _ := poisonKinds(granter, 256<<10, 1_000_000)
	s := newProduceSeq(granter, produceOpts{orders: 100_000, dupRate: 1, poison: 10, seed: 1, prefix: "b"}, kinds)
	most := 0
	for n := 0; ; n++ {
		if _, ok := s.next(); !ok {
			if n != 200_010 {
				t.Fatalf("%d records, want 200,010", n)
			}
			break
		}
		most = max(most, len(s.window))
	}
	if most > shuffleWindow+1 {
		t.Fatalf("the window held up to %d records, want at most %d", most, shuffleWindow+1)
	}
}

// TestProduceSendsTheSequence checks that `router produce` sends the pinned sequence to
// Kafka. Read back from a topic of one partition, the records are the reference's, in its
// order. They hold the poison and the duplicates that the PRODUCED line and the ledger
// count.
func TestProduceSendsTheSequence(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "produce-seq", 1)
	o := produceOpts{orders: 1500, dupRate: 0.3, poison: 11, seed: 77, prefix: "seq"}
	ledger := filepath.Join(t.TempDir(), "ledger.txt")
	out, err := capture(t, "--brokers", strings.Join(kc.Brokers, ","), "produce", "--plugin", coupon.PluginName, "--topic", topic,
		"--orders", fmt.Sprint(o.orders), "--dup-rate", fmt.Sprint(o.dupRate), "--poison", fmt.Sprint(o.poison),
		"--seed", fmt.Sprint(o.seed), "--prefix", o.prefix, "--batch", "64", "--ledger", ledger)
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	granter, _ := registered().Get(coupon.PluginName)
	kinds, _ := poisonKinds(granter, onceflow.DefaultConfig().Inbox.MaxPayloadBytes, 1_000_000)
	want := legacyProduce(granter, o, kinds)
	dups := len(want) - o.poison - o.orders
	if line := fmt.Sprintf("PRODUCED orders=%d deliveries=%d duplicates=%d poison=%d", o.orders, o.orders+dups, dups, o.poison); !strings.Contains(out, line) {
		t.Fatalf("output %q lacks %q", out, line)
	}

	consumer, err := sarama.NewConsumer(kc.Brokers, kc.ConsumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var got []record
	timeout := time.After(60 * time.Second)
	for len(got) < len(want) {
		select {
		case m := <-pc.Messages():
			r := record{key: m.Key, value: m.Value}
			if r.value == nil && len(want[len(got)].value) == 0 && want[len(got)].value != nil {
				r.value = []byte{} // Kafka keeps an empty value apart from none, but Sarama reads both as nil
			}
			for _, h := range m.Headers {
				r.headers = append(r.headers, *h)
			}
			got = append(got, r)
		case <-timeout:
			t.Fatalf("read %d of %d records", len(got), len(want))
		}
	}
	sameSequence(t, "read back", got, want)

	f, err := os.Open(ledger)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) != o.orders+1 || lines[0] != fmt.Sprintf("# prefix=%s orders=%d deliveries=%d poison=%d", o.prefix, o.orders, o.orders+dups, o.poison) ||
		lines[1] != "seq-000000" || lines[o.orders] != fmt.Sprintf("seq-%06d", o.orders-1) {
		t.Fatalf("ledger: %d lines, first %q", len(lines), lines[:min(2, len(lines))])
	}
}

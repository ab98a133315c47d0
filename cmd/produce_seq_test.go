package onceflowcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"math/rand/v2"
	"testing"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
)

// legacyProduce is how `produce` chose its records before it streamed them, kept verbatim
// (every message built in memory, shuffled in a window of 50, poison inserted at random
// places): the reference the streamed sequence must equal.
func legacyProduce(p inbox.Plugin, o produceOpts, kinds []poisonKind) []record {
	rng := rand.New(rand.NewPCG(o.seed, 7))
	var msgs []record
	for i := range o.orders {
		key := fmt.Sprintf("%s-%06d", o.prefix, i)
		value := p.Sample(key, i, rng)
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

// hashRecord adds what a record means to h: key, value (a tombstone apart from an empty
// value) and headers, but not the message id, which is random.
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

// produceCases are runs whose sequences are pinned: the coupon granter's Sample and
// Poison, with and without duplicates and poison, fewer orders than the shuffle window, and
// more poison than orders.
var produceCases = []struct {
	o    produceOpts
	want string // digest of the sequence before produce streamed
}{
	{produceOpts{orders: 1000, dupRate: 0.3, seed: 1, prefix: "ord"}, "a8597a10fcc4a692"},
	{produceOpts{orders: 1000, dupRate: 0.3, poison: 17, seed: 42, prefix: "ord"}, "315ee9bd8607d27e"},
	{produceOpts{orders: 30, dupRate: 1, poison: 3, seed: 7, prefix: "p"}, "df042b988b055205"},
	{produceOpts{orders: 200, dupRate: 0, seed: 3, prefix: "p"}, "7f7d598cb4cdbd09"},
	{produceOpts{orders: 5, dupRate: 0.5, poison: 40, seed: 9, prefix: "x"}, "e73f13e61c42d11a"},
	{produceOpts{orders: 0, poison: 2, seed: 1, prefix: "z"}, "f77f0f1b30ab5218"},
	{produceOpts{orders: 4000, dupRate: 0.3, poison: 8, seed: 2026, prefix: "demo"}, "6cd7de43acd15d10"},
}

// The sequence `produce --seed` sends is the one it sent before it streamed: the same
// keys, values, duplicates and poison in the same order.
func TestProduceSequencePinned(t *testing.T) {
	granter, _ := inbox.Plugins.Get(coupon.PluginName)
	kinds, _ := poisonKinds(granter, 256<<10, 1_000_000)
	for _, c := range produceCases {
		got := digest(legacyProduce(granter, c.o, kinds))
		t.Logf("%+v: %s", c.o, got)
		if got != c.want {
			t.Errorf("%+v: legacy digest %s, want %s", c.o, got, c.want)
		}
	}
}

package routercmd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
)

type produceOpts struct {
	plugin  string
	orders  int
	dupRate float64
	poison  int
	topic   string
	prefix  string
	seed    uint64
	ledger  string
	rate    float64
	batch   int
	file    string // records from a JSON-lines file instead of a Sampler, see produce_file.go
}

func (a *app) produceCmd() *cobra.Command {
	o := produceOpts{}
	cmd := &cobra.Command{
		Use:   "produce",
		Short: "load generator: N messages of a plugin's input (its Sampler), a share of them delivered twice as different Kafka messages; or the records of a file (--file)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.orders < 0 || !(o.dupRate >= 0 && o.dupRate <= 1) || o.poison < 0 || o.batch < 1 || !(o.rate >= 0 && o.rate <= 1e7) { // NaN fails the ranges
				return badInput(errors.New("produce: --orders, --poison >= 0, --dup-rate in [0,1], --batch >= 1, --rate >= 0"))
			}
			if o.file != "" {
				for _, f := range []string{"orders", "dup-rate", "poison", "prefix", "seed", "ledger"} {
					if cmd.Flags().Changed(f) {
						return badInput(fmt.Errorf("produce --file sends the file's records: --%s does not apply", f))
					}
				}
				return a.produceFile(cmd.Context(), o)
			}
			if o.prefix == "" {
				o.prefix = fmt.Sprintf("ord-%d", time.Now().UnixNano())
			}
			return a.produce(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.plugin, "plugin", "", "the plugin whose input to produce (default: the only registered plugin with a Sampler)")
	f.IntVar(&o.orders, "orders", 1000, "distinct messages (business keys <prefix>-000000, ...)")
	f.Float64Var(&o.dupRate, "dup-rate", 0.3, "share of keys delivered a second time (a different Kafka message, same meaning)")
	f.IntVar(&o.poison, "poison", 0, "poison records to add, each of which must end quarantined as poison; they cycle through "+
		"the hostile kinds of docs/RELIABILITY.md's chaos harness (the PRODUCED line says which were sent)")
	f.StringVar(&o.topic, "topic", "", "topic (default: the plugin's first topic, as configured)")
	f.StringVar(&o.prefix, "prefix", "", "order id prefix (default ord-<unix nanos>)")
	f.Uint64Var(&o.seed, "seed", 1, "random seed (repeatable runs)")
	f.StringVar(&o.ledger, "ledger", "", "write the produced order ids to this file (for `verify --ledger`)")
	f.Float64Var(&o.rate, "rate", 0, "messages per second (0 = as fast as possible)")
	f.IntVar(&o.batch, "batch", 200, "messages per produce request")
	f.StringVar(&o.file, "file", "", `send the records of this JSON-lines file instead, one per line: {"key": "...", "value": <JSON, or a string sent as its text>, "headers": {...}} (value_base64 for bytes); to --topic, else --plugin's first topic; read once, every line checked before the first is sent`)
	return cmd
}

// producePlugin is the plugin that `produce` makes input for. It is the one that --plugin
// names, else the only one with a Sampler.
func (a *app) producePlugin(name string) (onceflow.Plugin, error) {
	if err := a.CheckSections(); err != nil {
		return onceflow.Plugin{}, err
	}
	if name != "" {
		ps, err := a.Plugins(name)
		if err != nil {
			return onceflow.Plugin{}, err
		}
		if ps[0].Sampler == nil {
			return onceflow.Plugin{}, badInput(fmt.Errorf("plugin %s has no Sampler: produce cannot make its input", name))
		}
		return ps[0], nil
	}
	all, err := a.Plugins()
	if err != nil {
		return onceflow.Plugin{}, err
	}
	var with []onceflow.Plugin
	var names []string
	for _, p := range all {
		if p.Sampler != nil {
			with = append(with, p)
			names = append(names, p.Name)
		}
	}
	if len(with) != 1 {
		return onceflow.Plugin{}, badInput(fmt.Errorf("produce --plugin is required: %d registered plugins have a Sampler (%s)", len(with), strings.Join(names, ", ")))
	}
	return with[0], nil
}

func (a *app) produce(ctx context.Context, o produceOpts) error {
	p, err := a.producePlugin(o.plugin)
	if err != nil {
		return err
	}
	if o.topic == "" {
		o.topic = p.Topics[0]
	}
	kc := a.Kafka()
	if _, err := kc.CheckTopics(o.topic); err != nil {
		return err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	kinds, skipped := poisonKinds(p.Plugin, a.Config.Inbox.MaxPayloadBytes, kc.ProducerConfig().Producer.MaxMessageBytes)
	seq := newProduceSeq(p.Plugin, o, kinds)

	start := time.Now()
	sent := 0
	var batch []*sarama.ProducerMessage
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := producer.SendMessages(batch); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		sent += len(batch)
		batch = batch[:0]
		return nil
	}
	for i := 0; ; i++ {
		if err := context.Cause(ctx); err != nil {
			return fmt.Errorf("produce: stopped: %w; %d records were sent", err, sent)
		}
		m, ok := seq.next()
		if !ok {
			break
		}
		pm := &sarama.ProducerMessage{Topic: o.topic, Key: sarama.ByteEncoder(m.key), Headers: m.headers}
		if m.value != nil { // a nil value is a tombstone, sent as a nil Encoder, not an empty one
			pm.Value = sarama.ByteEncoder(m.value)
		}
		batch = append(batch, pm)
		if len(batch) >= o.batch {
			if err := flush(); err != nil {
				return err
			}
		}
		if o.rate > 0 {
			if due := start.Add(time.Duration(float64(i+1) / o.rate * float64(time.Second))); time.Until(due) > 0 {
				if err := flush(); err != nil {
					return err
				}
				sleepCtx(ctx, time.Until(due))
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	deliveries := seq.deliveries
	if o.ledger != "" {
		if err := writeLedger(o.ledger, o.prefix, o.orders, deliveries, o.poison); err != nil {
			return err
		}
	}
	var poisonNote string
	if o.poison > 0 {
		var names []string
		for _, k := range kinds[:min(len(kinds), o.poison)] {
			names = append(names, k.name)
		}
		poisonNote = " poison_kinds=" + strings.Join(names, ",")
		if skipped != "" {
			poisonNote += " " + skipped
		}
	}
	printf("PRODUCED orders=%d deliveries=%d duplicates=%d poison=%d%s topic=%s prefix=%s seconds=%.2f\n",
		o.orders, deliveries, deliveries-o.orders, o.poison, poisonNote, o.topic, o.prefix, time.Since(start).Seconds())
	return nil
}

// orderKey is the business key of the seq-th order of a run, and its Kafka key too.
func orderKey(prefix string, seq int) string { return fmt.Sprintf("%s-%06d", prefix, seq) }

// shuffleWindow is how many places later a record moves at most. So a duplicate arrives a
// little after its original, not next to it.
const shuffleWindow = 50

// produceSeq is the sequence of records that a produce run sends. It generates them a few
// at a time, so memory stays flat however many orders the run has. The sequence is the one
// a seed has always meant. One source, seeded by --seed, makes every draw. For each order
// it draws the value from the plugin's Sampler, then a draw that decides the order's
// duplicate. From where the source stands after the last order, it shuffles the records
// within a window of shuffleWindow. A record swaps with one of the next 49, never with a
// record of its own key. Then it inserts the --poison records at random places of the
// shuffled sequence.
//
// Streaming needs the source's state after the last order before the first record goes out.
// So newProduceSeq runs through the orders once, drawing as generation does but keeping
// nothing, and saves that state for the shuffle. The poison places are drawn after the
// shuffle's draws. So newProduceSeq makes those draws too and turns the insertions into
// final positions. That takes time quadratic in the poison records and memory linear in
// them. next then regenerates the orders from the seed and keeps only the shuffle's window.
type produceSeq struct {
	p     inbox.Plugin
	o     produceOpts
	kinds []poisonKind

	deliveries int // the order records, counting an order with a duplicate twice
	total      int // deliveries + poison

	gen       *rand.Rand // regenerates the orders with the same draws as the counting pass
	shuffle   *rand.Rand // makes the shuffle's draws from the state that generation left
	nextOrder int        // the next order gen makes
	window    []record   // the shuffle's window of records generated ahead and shuffled onwards
	shuffled  int        // records that left the window
	poison    []poisonPlace
	emitted   int
}

// poisonPlace is where the seq-th poison record goes in the whole sequence.
type poisonPlace struct{ at, seq int }

func newProduceSeq(p inbox.Plugin, o produceOpts, kinds []poisonKind) *produceSeq {
	s := &produceSeq{p: p, o: o, kinds: kinds}
	src := rand.NewPCG(o.seed, 7)
	rng := rand.New(src)
	for i := range o.orders {
		p.Sampler.Sample(orderKey(o.prefix, i), i, rng)
		s.deliveries++
		if rng.Float64() < o.dupRate {
			s.deliveries++
		}
	}
	state, err := src.MarshalBinary()
	if err != nil {
		panic(err) // a PCG always marshals
	}
	shuffleSrc := new(rand.PCG)
	if err := shuffleSrc.UnmarshalBinary(state); err != nil {
		panic(err)
	}
	s.shuffle = rand.New(shuffleSrc)
	n := s.deliveries
	for i := range n {
		rng.IntN(min(n-i, shuffleWindow))
	}
	// Poison i went to a place among the n+i records there were. Each later poison record
	// inserted at or before it moved it one place on.
	at := make([]int, o.poison)
	for i := range o.poison {
		pos := rng.IntN(n + i + 1)
		for j := range i {
			if at[j] >= pos {
				at[j]++
			}
		}
		at[i] = pos
	}
	for i, a := range at {
		s.poison = append(s.poison, poisonPlace{at: a, seq: i})
	}
	slices.SortFunc(s.poison, func(a, b poisonPlace) int { return a.at - b.at })
	s.total = n + o.poison
	s.gen = rand.New(rand.NewPCG(o.seed, 7))
	return s
}

// next returns the next record to send. It returns false after the last.
func (s *produceSeq) next() (record, bool) {
	if s.emitted == s.total {
		return record{}, false
	}
	s.emitted++
	if len(s.poison) > 0 && s.poison[0].at == s.emitted-1 {
		i := s.poison[0].seq
		s.poison = s.poison[1:]
		return s.kinds[i%len(s.kinds)].record(s.o.prefix, i), true
	}
	span := min(s.deliveries-s.shuffled, shuffleWindow)
	for len(s.window) < span {
		s.generate()
	}
	if j := s.shuffle.IntN(span); string(s.window[0].key) != string(s.window[j].key) {
		s.window[0], s.window[j] = s.window[j], s.window[0]
	}
	r := s.window[0]
	s.window[0] = record{}
	s.window = s.window[1:]
	s.shuffled++
	return r, true
}

// generate appends the next order, and its duplicate when it has one, to the window. The
// duplicate is a different Kafka message with the same meaning, arriving later.
func (s *produceSeq) generate() {
	i := s.nextOrder
	s.nextOrder++
	key := orderKey(s.o.prefix, i)
	value := s.p.Sampler.Sample(key, i, s.gen)
	s.window = append(s.window, keyRecord(key, value))
	if s.gen.Float64() < s.o.dupRate {
		s.window = append(s.window, keyRecord(key, value))
	}
}

// record is one Kafka record to send, with its key, value and headers. A nil value makes a
// tombstone.
type record struct {
	key, value []byte
	headers    []sarama.RecordHeader
}

func uuidHeader(v string) sarama.RecordHeader {
	return sarama.RecordHeader{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(v)}
}

// keyRecord is a record as a producer sends it. The business key is its Kafka key, and a
// header holds a message id.
func keyRecord(key string, payload []byte) record {
	return record{key: []byte(key), value: payload, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
}

// poisonKind is one kind of outside record that the inbox must quarantine as poison.
type poisonKind struct {
	name string
	// record returns the i-th poison record of a produce run.
	record func(prefix string, i int) record
}

// bigHeaders is 70 KiB of headers. That is more than inbox.max_metadata_bytes can be, which
// is 65,535 at most.
var bigHeaders = func() []sarama.RecordHeader {
	var hs []sarama.RecordHeader
	for i := range 7 {
		hs = append(hs, sarama.RecordHeader{Key: []byte(fmt.Sprintf("x-big-%d", i)), Value: []byte(strings.Repeat("h", 10<<10))})
	}
	return hs
}()

// poisonKinds lists the kinds that `produce --poison` cycles through for p. Some kinds are
// built on a value that p refuses, which the Poison method of p's Sampler returns. They are
// left out when p's Sampler is no inbox.Poisoner or returns no such value. The oversized
// value is 1 KiB over maxPayload, the router's inbox.max_payload_bytes. It is left out when
// it would not fit maxMessage, the producer's max message size. skipped says what was left
// out, and why.
func poisonKinds(p inbox.Plugin, maxPayload, maxMessage int) (kinds []poisonKind, skipped string) {
	key := func(i int) []byte { return []byte(fmt.Sprintf("poison-%d", i)) }
	poisoner, _ := p.Sampler.(inbox.Poisoner)
	refuses := poisoner != nil && len(poisoner.Poison("")) > 0
	bad := func(prefix string, i int) []byte { // one of the refused values, by i
		vs := poisoner.Poison(prefix)
		return vs[i%len(vs)]
	}
	// good makes a good-looking value for a key of the run's prefix that no ledger lists.
	// Were it processed, the chaos checker would report it. It has its own random source,
	// so the run's orders do not depend on how many poison records the run has.
	good := func(key string, i int) []byte { return p.Sampler.Sample(key, i, rand.New(rand.NewPCG(uint64(i), 11))) }
	var skips []string
	if refuses {
		kinds = append(kinds, poisonKind{"bad-value", func(prefix string, i int) record {
			return record{key: key(i), value: bad(prefix, i), headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}})
	} else {
		skips = append(skips, "bad-value,utf8-value,utf8-key,utf8-headers,utf8-string=skipped(plugin_"+p.Name+"_has_no_Poisoner)")
	}
	kinds = append(kinds,
		poisonKind{"tombstone", func(_ string, i int) record {
			return record{key: key(i), value: nil, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}},
		poisonKind{"empty", func(_ string, i int) record {
			return record{key: key(i), value: []byte{}, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}})
	if refuses {
		kinds = append(kinds,
			// utf8-value puts two bytes that are not UTF-8 before a refused value. The
			// decoder's error may quote them, and the stored last_error must still be
			// UTF-8.
			poisonKind{"utf8-value", func(prefix string, i int) record {
				return record{key: key(i), value: append([]byte("\xff\xfe"), bad(prefix, i)...), headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
			}},
			poisonKind{"utf8-key", func(prefix string, i int) record {
				return record{key: append([]byte("\xff\xfe"), key(i)...), value: bad(prefix, i),
					headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
			}},
			poisonKind{"utf8-headers", func(prefix string, i int) record {
				return record{key: key(i), value: bad(prefix, i), headers: []sarama.RecordHeader{
					{Key: []byte("trace\xff"), Value: []byte("v\xfe\xfd")}, uuidHeader("\xff\xfe" + watermill.NewUUID())}}
			}},
			// utf8-string puts a byte that is not UTF-8 right after the business key in a
			// good value. The byte goes at the value's end if the value does not hold the
			// key. A decoder that made the byte U+FFFD would take the value for an order of
			// the run's prefix, which no ledger lists.
			poisonKind{"utf8-string", func(prefix string, i int) record {
				k := []byte(fmt.Sprintf("%s-poison-u8-%d", prefix, i))
				v := good(string(k), i)
				if at := bytes.Index(v, k); at >= 0 {
					v = slices.Insert(v, at+len(k), 0xff)
				} else {
					v = append(v, 0xff)
				}
				return record{key: key(i), value: v, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
			}})
	}
	kinds = append(kinds, poisonKind{"big-headers", func(prefix string, i int) record {
		return record{key: key(i), value: good(fmt.Sprintf("%s-poison-hdr-%d", prefix, i), i),
			headers: append([]sarama.RecordHeader{uuidHeader(watermill.NewUUID())}, bigHeaders...)}
	}})
	// The record's own framing of key, headers and lengths needs well under 1 KiB. The
	// padding is trailing white space, which leaves a JSON value the same value. So only
	// the size limit makes it poison.
	if need := maxPayload + 2<<10; maxPayload > 0 && need <= maxMessage {
		kinds = append(kinds, poisonKind{"oversized", func(prefix string, i int) record {
			v := good(fmt.Sprintf("%s-poison-big-%d", prefix, i), i)
			v = append(v, bytes.Repeat([]byte(" "), max(0, maxPayload+1<<10-len(v)))...)
			return record{key: key(i), value: v, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}})
	} else {
		skips = append(skips, fmt.Sprintf("oversized=skipped(inbox.max_payload_bytes=%d+1KiB_does_not_fit_producer_max_message_bytes=%d)", maxPayload, maxMessage))
	}
	return kinds, strings.Join(skips, " ")
}

// ledger is what the producer sent, as `verify --ledger` reads it back.
type ledger struct {
	prefix     string
	orders     []string
	deliveries int
	poison     int
}

func writeLedger(path, prefix string, orders, deliveries, poison int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "# prefix=%s orders=%d deliveries=%d poison=%d\n", prefix, orders, deliveries, poison)
	for i := range orders {
		fmt.Fprintln(w, orderKey(prefix, i))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("ledger: %w", err)
	}
	return f.Close()
}

func readLedgers(paths []string) (ledger, error) {
	var l ledger
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return l, badInput(fmt.Errorf("ledger: %w", err))
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if strings.HasPrefix(line, "#") {
				var orders, deliveries, poison int
				var prefix string
				if _, err := fmt.Sscanf(line, "# prefix=%s orders=%d deliveries=%d poison=%d", &prefix, &orders, &deliveries, &poison); err == nil {
					l.deliveries += deliveries
					l.poison += poison
					l.prefix = prefix
				}
				continue
			}
			if line != "" {
				l.orders = append(l.orders, line)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return l, fmt.Errorf("ledger %s: %w", path, err)
		}
	}
	return l, nil
}

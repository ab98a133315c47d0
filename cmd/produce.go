package onceflowcmd

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/coupon"
)

type produceOpts struct {
	orders  int
	dupRate float64
	poison  int
	topic   string
	prefix  string
	seed    uint64
	ledger  string
	rate    float64
	batch   int
}

func (a *app) produceCmd() *cobra.Command {
	o := produceOpts{}
	cmd := &cobra.Command{
		Use:   "produce",
		Short: "load generator: N order-paid events, a share of them delivered twice as different Kafka messages",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.orders < 0 || o.dupRate < 0 || o.dupRate > 1 || o.poison < 0 || o.batch < 1 || o.rate < 0 {
				return badInput(errors.New("produce: --orders, --poison >= 0, --dup-rate in [0,1], --batch >= 1, --rate >= 0"))
			}
			if o.prefix == "" {
				o.prefix = fmt.Sprintf("ord-%d", time.Now().UnixNano())
			}
			return a.produce(o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.orders, "orders", 1000, "distinct orders")
	f.Float64Var(&o.dupRate, "dup-rate", 0.3, "share of orders delivered a second time (a different Kafka message, same meaning)")
	f.IntVar(&o.poison, "poison", 0, "poison records to add, each of which must end quarantined as poison; they cycle through "+
		"the kinds: bad JSON (truncated, missing orderId or userId, wrong type, not JSON), a tombstone (nil value), an empty value, "+
		"invalid UTF-8 inside a JSON string, bad JSON under an invalid-UTF-8 key, bad JSON with invalid-UTF-8 header key, value and "+
		"message id, an order with 70 KiB of headers (over inbox.max_metadata_bytes), and a value 1 KiB over the loaded "+
		"inbox.max_payload_bytes — that last kind only when it fits the producer's max message size (1,000,000 bytes), so not "+
		"with the default 1 MiB limit (the PRODUCED line says which kinds were sent)")
	f.StringVar(&o.topic, "topic", coupon.OrderPaidTopic, "topic")
	f.StringVar(&o.prefix, "prefix", "", "order id prefix (default ord-<unix nanos>)")
	f.Uint64Var(&o.seed, "seed", 1, "random seed (repeatable runs)")
	f.StringVar(&o.ledger, "ledger", "", "write the produced order ids to this file (for `verify --ledger`)")
	f.Float64Var(&o.rate, "rate", 0, "messages per second (0 = as fast as possible)")
	f.IntVar(&o.batch, "batch", 200, "messages per produce request")
	return cmd
}

func (a *app) produce(o produceOpts) error {
	kc := a.kafka()
	if _, err := kc.CheckTopics(o.topic); err != nil {
		return err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	rng := rand.New(rand.NewPCG(o.seed, 7))
	paidAt := time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)

	var (
		msgs []record
		ids  []string
	)
	for i := range o.orders {
		op := coupon.OrderPaid{OrderID: fmt.Sprintf("%s-%06d", o.prefix, i), UserID: fmt.Sprintf("u%d", rng.IntN(1_000_000)),
			AmountCents: int64(1000 + rng.IntN(100000)), PaidAt: paidAt.Add(time.Duration(i) * time.Millisecond)}
		ids = append(ids, op.OrderID)
		msgs = append(msgs, orderRecord(op.OrderID, op.Encode()))
		if rng.Float64() < o.dupRate {
			// The duplicate is a different Kafka message with the same meaning, arriving later.
			msgs = append(msgs, orderRecord(op.OrderID, op.Encode()))
		}
	}
	// Shuffle within a sliding window so duplicates arrive a little later, not adjacent.
	for i := range msgs {
		j := i + rng.IntN(min(len(msgs)-i, 50))
		if string(msgs[i].key) != string(msgs[j].key) {
			msgs[i], msgs[j] = msgs[j], msgs[i]
		}
	}
	kinds, skipped := poisonKinds(a.cfg.Inbox.MaxPayloadBytes, kc.ProducerConfig().Producer.MaxMessageBytes)
	for i := range o.poison {
		r := kinds[i%len(kinds)].record(o.prefix, i)
		pos := rng.IntN(len(msgs) + 1)
		msgs = append(msgs[:pos], append([]record{r}, msgs[pos:]...)...)
	}

	start := time.Now()
	var batch []*sarama.ProducerMessage
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := producer.SendMessages(batch); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		batch = batch[:0]
		return nil
	}
	for i, m := range msgs {
		pm := &sarama.ProducerMessage{Topic: o.topic, Key: sarama.ByteEncoder(m.key), Headers: m.headers}
		if m.value != nil { // nil: a tombstone (a nil Encoder, not an empty one)
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
				time.Sleep(time.Until(due))
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	deliveries := len(msgs) - o.poison
	if o.ledger != "" {
		if err := writeLedger(o.ledger, o.prefix, ids, deliveries, o.poison); err != nil {
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

// record is one Kafka record to send: key, value (nil: a tombstone) and headers.
type record struct {
	key, value []byte
	headers    []sarama.RecordHeader
}

func uuidHeader(v string) sarama.RecordHeader {
	return sarama.RecordHeader{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(v)}
}

// orderRecord is an order-paid record as a producer sends it: key = order id, a message id.
func orderRecord(orderID string, payload []byte) record {
	return record{key: []byte(orderID), value: payload, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
}

// poisonKind is one kind of outside record that the inbox must quarantine as poison.
type poisonKind struct {
	name string
	// record returns the i-th poison record of a produce run.
	record func(prefix string, i int) record
}

// bigHeaders is 70 KiB of headers: more than inbox.max_metadata_bytes can be (65,535).
var bigHeaders = func() []sarama.RecordHeader {
	var hs []sarama.RecordHeader
	for i := range 7 {
		hs = append(hs, sarama.RecordHeader{Key: []byte(fmt.Sprintf("x-big-%d", i)), Value: []byte(strings.Repeat("h", 10<<10))})
	}
	return hs
}()

// poisonKinds lists the kinds `produce --poison` cycles through. The oversized value (1 KiB
// over maxPayload, the router's inbox.max_payload_bytes) is left out when it would not fit
// maxMessage, the producer's max message size; skipped then says why.
func poisonKinds(maxPayload, maxMessage int) (kinds []poisonKind, skipped string) {
	key := func(i int) []byte { return []byte(fmt.Sprintf("poison-%d", i)) }
	badJSON := func(prefix string, i int) []byte { // one of the bad payloads, by i
		p := poisonPayloads(prefix)
		return p[i%len(p)]
	}
	kinds = []poisonKind{
		{"bad-json", func(prefix string, i int) record {
			return record{key: key(i), value: badJSON(prefix, i), headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}},
		{"tombstone", func(_ string, i int) record {
			return record{key: key(i), value: nil, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}},
		{"empty", func(_ string, i int) record {
			return record{key: key(i), value: []byte{}, headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}},
		// Invalid UTF-8 inside a JSON string: encoding/json would quietly turn it into U+FFFD
		// in orderId or userId, so it sits in amountCents, which must be a number; the
		// decoder's error quotes the bytes (the stored last_error must still be UTF-8).
		{"utf8-value", func(prefix string, i int) record {
			v := fmt.Sprintf(`{"orderId":"%s-poison-utf8-%d","userId":"u1","amountCents":"`+"\xff\xfe"+`"}`, prefix, i)
			return record{key: key(i), value: []byte(v), headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}},
		{"utf8-key", func(prefix string, i int) record {
			return record{key: append([]byte("\xff\xfe"), key(i)...), value: badJSON(prefix, i),
				headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}},
		{"utf8-headers", func(prefix string, i int) record {
			return record{key: key(i), value: badJSON(prefix, i), headers: []sarama.RecordHeader{
				{Key: []byte("trace\xff"), Value: []byte("v\xfe\xfd")}, uuidHeader("\xff\xfe" + watermill.NewUUID())}}
		}},
		// A good-looking order (an id of the run's prefix that no ledger lists: were it
		// granted, the chaos checker would report it) under 70 KiB of headers.
		{"big-headers", func(prefix string, i int) record {
			op := coupon.OrderPaid{OrderID: fmt.Sprintf("%s-poison-hdr-%d", prefix, i), UserID: "u1", AmountCents: 100}
			return record{key: key(i), value: op.Encode(), headers: append([]sarama.RecordHeader{uuidHeader(watermill.NewUUID())}, bigHeaders...)}
		}},
	}
	// The record's own framing (key, header, lengths) needs well under 1 KiB.
	if need := maxPayload + 2<<10; maxPayload > 0 && need <= maxMessage {
		kinds = append(kinds, poisonKind{"oversized", func(prefix string, i int) record {
			head := fmt.Sprintf(`{"orderId":"%s-poison-big-%d","userId":"u1","amountCents":100,"pad":"`, prefix, i)
			v := head + strings.Repeat("a", maxPayload+1<<10-len(head)-2) + `"}`
			return record{key: key(i), value: []byte(v), headers: []sarama.RecordHeader{uuidHeader(watermill.NewUUID())}}
		}})
	} else {
		skipped = fmt.Sprintf("oversized=skipped(inbox.max_payload_bytes=%d+1KiB_does_not_fit_producer_max_message_bytes=%d)", maxPayload, maxMessage)
	}
	return kinds, skipped
}

func poisonPayloads(prefix string) [][]byte {
	return [][]byte{
		[]byte(`{"orderId": "` + prefix + `-bad", "userId": `), // truncated JSON
		[]byte(`{"userId": "u1", "amountCents": 100}`),         // missing orderId
		[]byte(`{"orderId": "` + prefix + `-nouser"}`),         // missing userId
		[]byte(`{"orderId": 42, "userId": "u1"}`),              // wrong type
		[]byte(`not json at all`),
	}
}

// Ledger: what the producer sent, read back by `verify --ledger`.
type ledger struct {
	prefix     string
	orders     []string
	deliveries int
	poison     int
}

func writeLedger(path, prefix string, ids []string, deliveries, poison int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "# prefix=%s orders=%d deliveries=%d poison=%d\n", prefix, len(ids), deliveries, poison)
	for _, id := range ids {
		fmt.Fprintln(w, id)
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

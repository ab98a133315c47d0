package main

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
	f.IntVar(&o.poison, "poison", 0, "poison messages to add (bad JSON, missing fields, wrong types)")
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

	type delivery struct {
		key     string
		payload []byte
	}
	var (
		msgs []delivery
		ids  []string
	)
	for i := range o.orders {
		op := coupon.OrderPaid{OrderID: fmt.Sprintf("%s-%06d", o.prefix, i), UserID: fmt.Sprintf("u%d", rng.IntN(1_000_000)),
			AmountCents: int64(1000 + rng.IntN(100000)), PaidAt: paidAt.Add(time.Duration(i) * time.Millisecond)}
		ids = append(ids, op.OrderID)
		msgs = append(msgs, delivery{op.OrderID, op.Encode()})
		if rng.Float64() < o.dupRate {
			// The duplicate is a different Kafka message with the same meaning, arriving later.
			msgs = append(msgs, delivery{op.OrderID, op.Encode()})
		}
	}
	// Shuffle within a sliding window so duplicates arrive a little later, not adjacent.
	for i := range msgs {
		j := i + rng.IntN(min(len(msgs)-i, 50))
		if msgs[i].key != msgs[j].key {
			msgs[i], msgs[j] = msgs[j], msgs[i]
		}
	}
	poison := poisonPayloads(o.prefix)
	for i := range o.poison {
		p := poison[i%len(poison)]
		pos := rng.IntN(len(msgs) + 1)
		msgs = append(msgs[:pos], append([]delivery{{fmt.Sprintf("poison-%d", i), p}}, msgs[pos:]...)...)
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
		batch = append(batch, &sarama.ProducerMessage{Topic: o.topic, Key: sarama.StringEncoder(m.key), Value: sarama.ByteEncoder(m.payload),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}})
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
	printf("PRODUCED orders=%d deliveries=%d duplicates=%d poison=%d topic=%s prefix=%s seconds=%.2f\n",
		o.orders, deliveries, deliveries-o.orders, o.poison, o.topic, o.prefix, time.Since(start).Seconds())
	return nil
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

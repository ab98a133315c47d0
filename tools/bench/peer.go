package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox/engine"
)

// peerGroup: the pipeline a team writes today without onceflow, side by side with onceflow
// on the same input. Two topics are loaded with the same -peer-orders orders, -dup-pct (30 %) of them
// delivered twice (the copy a different Kafka message with the same payload, some hundreds
// of records later); then
//
//   - the peer: a Watermill router, watermill-kafka's subscriber with its defaults (sarama's
//     auto-commit on; Version raised for Kafka 4), a handler that writes the coupon with a
//     plain INSERT guarded by a unique key in one transaction and then publishes the event
//     with watermill-kafka's synchronous publisher (at least once, no outbox). It publishes
//     on every delivery, duplicates included: an at-least-once pipeline cannot tell whether
//     the earlier delivery's publish went out, so skipping it could lose the event.
//   - onceflow, as the router runs it (group commit, the exactly-once relay), on the other.
//
// Each is timed from start until a read_committed watcher of its output topic has seen
// every order's event, with the CPU per order of each process on this host. Then, still
// running, it gets -peer-rate orders/s for -load-seconds more, and its p50/p99 are those
// orders' latencies from their Kafka timestamp to their event seen by the watcher (as in
// the e2e latency runs). Its duplicate events are the records of its output beyond one per
// order, read back read_committed at the end.
func (s *suite) peerGroup(ctx context.Context) error {
	if err := s.benchPeer(ctx); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	return nil
}

func (s *suite) benchPeer(ctx context.Context) error {
	n := s.cfg.peerN
	if n <= 0 {
		return nil
	}
	if err := s.truncate(ctx); err != nil {
		return err
	}
	if _, err := s.lock.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS peer_coupon (
    order_id    VARCHAR(64) NOT NULL,
    user_id     VARCHAR(64) NOT NULL,
    value_cents BIGINT      NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (order_id)
) ENGINE = InnoDB`); err != nil {
		return err
	}
	if _, err := s.lock.ExecContext(ctx, "TRUNCATE TABLE peer_coupon"); err != nil {
		return err
	}
	if err := s.grantOwn(ctx, "peer_coupon"); err != nil {
		return err
	}
	kc := s.kc
	// Two topics with the same records (the same seed): each pipeline's latency phase adds
	// orders to its own input only.
	in, cleanIn, err := makeTopic(kc, "bench-peer-order-paid", int32(s.cfg.e2eParts))
	if err != nil {
		return err
	}
	defer cleanIn()
	onceIn, cleanOnceIn, err := makeTopic(kc, "bench-peer-onceflow-order-paid", int32(s.cfg.e2eParts))
	if err != nil {
		return err
	}
	defer cleanOnceIn()
	peerOut, cleanPeer, err := makeTopic(kc, "bench-peer-granted", int32(s.cfg.e2eParts))
	if err != nil {
		return err
	}
	defer cleanPeer()
	onceOut, cleanOnce, err := makeTopic(kc, "bench-peer-onceflow-granted", int32(s.cfg.e2eParts))
	if err != nil {
		return err
	}
	defer cleanOnce()

	deliveries, err := s.loadPeerInput(in, n)
	if err != nil {
		return err
	}
	if _, err := s.loadPeerInput(onceIn, n); err != nil {
		return err
	}
	peer, err := s.runPeer(ctx, in, peerOut, n, deliveries)
	if err != nil {
		return err
	}
	once, err := s.runOnceflowOn(ctx, onceIn, onceOut, n)
	if err != nil {
		return err
	}
	s.report("peer_watermill", append([]any{"orders", n, "deliveries", deliveries, "orders_per_s", peer.perS, "cpu_us_per_order", peer.cpuUS,
		"offered_per_s", s.cfg.peerRate, "p50_ms", peer.p50, "p99_ms", peer.p99, "duplicate_events", peer.dupEvents}, peer.cpu...)...)
	s.report("peer_onceflow", append([]any{"orders", n, "deliveries", deliveries, "orders_per_s", once.perS, "cpu_us_per_order", once.cpuUS,
		"offered_per_s", s.cfg.peerRate, "p50_ms", once.p50, "p99_ms", once.p99, "duplicate_events", once.dupEvents}, once.cpu...)...)
	s.report("ratio", "e2e_vs_peer", once.perS/peer.perS, "cpu_peer_vs_e2e", peer.cpuUS/once.cpuUS)
	return nil
}

type peerResult struct {
	perS, cpuUS, p50, p99 float64
	dupEvents             int
	cpu                   []any // CPU per order by process (cpuMeter.perOrder)
}

// loadPeerInput writes orders 0..n-1 to topic, -dup-pct of them a second time a few
// hundred records later (a new message id, the same payload), and returns how many records
// it wrote.
func (s *suite) loadPeerInput(topic string, n int) (int, error) {
	p, err := s.kc.NewSyncProducer()
	if err != nil {
		return 0, err
	}
	defer p.Close()
	rng := rand.New(rand.NewPCG(24, 24))
	later := map[int][]int{} // position → orders whose copy goes there
	var batch []*sarama.ProducerMessage
	total := 0
	send := func(i int) error {
		o := order("peer", i)
		batch = append(batch, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(o.Encode()),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}})
		total++
		if len(batch) >= 500 {
			err := p.SendMessages(batch)
			batch = batch[:0]
			return err
		}
		return nil
	}
	for i := 0; i < n || len(later) > 0; i++ {
		if i < n {
			if err := send(i); err != nil {
				return 0, err
			}
			if rng.Float64()*100 < s.cfg.dupPct {
				at := i + 1 + rng.IntN(500)
				later[at] = append(later[at], i)
			}
		}
		for _, j := range later[i] {
			if err := send(j); err != nil {
				return 0, err
			}
		}
		delete(later, i)
	}
	if len(batch) > 0 {
		if err := p.SendMessages(batch); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// runPeer runs the peer pipeline on topic until it has handled every delivery.
func (s *suite) runPeer(ctx context.Context, in, out string, n, deliveries int) (peerResult, error) {
	logger := watermill.NopLogger{}
	subCfg := wkafka.DefaultSaramaSubscriberConfig()
	subCfg.Version = sarama.V2_1_0_0                      // Kafka 4 refuses the older request versions of the default
	subCfg.Consumer.Offsets.Initial = sarama.OffsetOldest // the topic was loaded before the group existed
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{Brokers: s.kc.Brokers, Unmarshaler: wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: subCfg, ConsumerGroup: "bench-peer-" + in}, logger)
	if err != nil {
		return peerResult{}, err
	}
	pubCfg := wkafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Version = sarama.V2_1_0_0
	pub, err := wkafka.NewPublisher(wkafka.PublisherConfig{Brokers: s.kc.Brokers, OverwriteSaramaConfig: pubCfg,
		Marshaler: wkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) { return m.Metadata.Get("key"), nil })}, logger)
	if err != nil {
		return peerResult{}, err
	}
	defer pub.Close()
	r, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return peerResult{}, err
	}
	var handled atomic.Int64
	db := s.db
	r.AddConsumerHandler("peer", in, sub, func(msg *message.Message) error {
		var o coupon.OrderPaid
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return nil // poison: dropped (there is none in this input)
		}
		tx, err := db.BeginTx(msg.Context(), nil)
		if err != nil {
			return err
		}
		if _, err := tx.Exec("INSERT IGNORE INTO peer_coupon (order_id, user_id, value_cents) VALUES (?, ?, ?)", o.OrderID, o.UserID, 500); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		ev := message.NewMessage(watermill.NewUUID(), coupon.GrantEvent{EventID: watermill.NewUUID(), OrderID: o.OrderID, UserID: o.UserID,
			CampaignID: "peer", CouponID: coupon.CouponID(o.OrderID, "peer"), ValueCents: 500, GrantedAt: time.Now().UTC()}.Encode())
		ev.Metadata.Set("key", o.OrderID)
		if err := pub.Publish(out, ev); err != nil {
			return err
		}
		handled.Add(1)
		return nil
	})
	w, err := watch(s.kc, out)
	if err != nil {
		return peerResult{}, err
	}
	defer w.close()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cpu := newCPUMeter(s.services)
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(cctx) }()
	if err := w.wait(n, 30*time.Minute); err != nil {
		return peerResult{}, fmt.Errorf("peer: %w (%d of %d deliveries handled)", err, handled.Load(), deliveries)
	}
	el := time.Since(start)
	kv := cpu.perOrder(n)
	res := peerResult{perS: float64(n) / el.Seconds(), cpuUS: kv[len(kv)-1].(float64), cpu: kv}
	if res.p50, res.p99, err = s.peerLatency(in, w, n); err != nil {
		return peerResult{}, err
	}
	cancel()
	<-errc
	var coupons int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM peer_coupon").Scan(&coupons); err != nil || coupons != n+s.peerLoad() {
		return peerResult{}, fmt.Errorf("peer: %d coupons for %d orders (%v)", coupons, n+s.peerLoad(), err)
	}
	if res.dupEvents, err = s.duplicateKeys(ctx, out); err != nil {
		return peerResult{}, err
	}
	return res, nil
}

// peerLoad is how many orders the latency phase sends.
func (s *suite) peerLoad() int { return s.cfg.peerRate * s.cfg.loadSecs }

// peerLatency sends peerLoad orders to in at -peer-rate, on top of the seen orders w saw
// already, and returns their p50 and p99 from Kafka timestamp to event seen.
func (s *suite) peerLatency(in string, w *watcher, seen int) (p50, p99 float64, err error) {
	p, err := s.kc.NewSyncProducer()
	if err != nil {
		return 0, 0, err
	}
	defer p.Close()
	e := &e2eRun{s: s}
	prefix := fmt.Sprintf("peerlat%d", time.Now().UnixNano())
	if err := e.produceOrders(p, in, prefix, 0, s.peerLoad(), float64(s.cfg.peerRate)); err != nil {
		return 0, 0, err
	}
	if err := w.wait(seen+s.peerLoad(), 5*time.Minute); err != nil {
		return 0, 0, err
	}
	p50, p99, _, err = latencies(s.kc, in, w, prefix, 0, s.peerLoad())
	return p50, p99, err
}

// runOnceflowOn runs onceflow's pipeline, as the router runs it, on topic in until a
// read_committed consumer of out has seen every order's event.
func (s *suite) runOnceflowOn(ctx context.Context, in, out string, n int) (peerResult, error) {
	if err := s.truncate(ctx); err != nil {
		return peerResult{}, err
	}
	h, _, closeH, err := s.coupon(ctx, out, false)
	if err != nil {
		return peerResult{}, err
	}
	defer closeH()
	e := &e2eRun{s: s, mode: "batch"}
	ib, err := engine.New(s.db, h, engine.Config{BizType: coupon.BizType, StepsPerTx: s.cfg.e2eSPT}, nil, &e.wake)
	if err != nil {
		return peerResult{}, err
	}
	w, err := watch(s.kc, out)
	if err != nil {
		return peerResult{}, err
	}
	defer w.close()
	stop, err := e.startPipeline(ctx, in, ib)
	if err != nil {
		return peerResult{}, err
	}
	cpu := newCPUMeter(s.services)
	start := time.Now()
	err = w.wait(n, 10*time.Minute)
	el := time.Since(start)
	kv := cpu.perOrder(n)
	if err != nil {
		stop()
		return peerResult{}, err
	}
	res := peerResult{perS: float64(n) / el.Seconds(), cpuUS: kv[len(kv)-1].(float64), cpu: kv}
	res.p50, res.p99, err = s.peerLatency(in, w, n)
	stop()
	if err != nil {
		return peerResult{}, err
	}
	if err := checkGranted(ctx, s.db, n+s.peerLoad()); err != nil {
		return peerResult{}, err
	}
	if res.dupEvents, err = s.duplicateKeys(ctx, out); err != nil {
		return peerResult{}, err
	}
	return res, nil
}

// duplicateKeys reads topic back (read_committed) and counts the records beyond one per key.
func (s *suite) duplicateKeys(ctx context.Context, topic string) (int, error) {
	recs, err := s.kc.ReadAll(ctx, topic, 2*time.Second)
	if err != nil {
		return 0, err
	}
	seen := make(map[string]bool, len(recs))
	for _, r := range recs {
		seen[string(r.Key)] = true
	}
	return len(recs) - len(seen), nil
}

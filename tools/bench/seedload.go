package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// countingService wraps the simulated calls and tracks how many are in flight.
type countingService struct {
	svc            coupon.ExternalService
	inFlight, peak atomic.Int64
	calls          atomic.Int64
}

func (s *countingService) Call(ctx context.Context, step, key string) error {
	n := s.inFlight.Add(1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	s.calls.Add(1)
	defer s.inFlight.Add(-1)
	return s.svc.Call(ctx, step, key)
}

// claimCounter counts partition claims: more than the partitions means a rebalance.
type claimCounter struct {
	watermill.LoggerAdapter
	claims *atomic.Int64
}

func (c claimCounter) Debug(msg string, _ watermill.LogFields) {
	if msg == "Partition claimed" {
		c.claims.Add(1)
	}
}
func (c claimCounter) With(watermill.LogFields) watermill.LoggerAdapter { return c }

// scaled is d times -seed-scale.
func (c *config) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.seedScale)
}

// seedMessages is the run's deliveries: every order, dupRate of them twice (the copy a
// different message a little later), in bursts of 500 as the write-up's polls.
func seedMessages(prefix string, n int, dupRate float64, rng *rand.Rand) []*sarama.ProducerMessage {
	var msgs []*sarama.ProducerMessage
	for i := range n {
		o := order(prefix, i)
		m := func() *sarama.ProducerMessage {
			return &sarama.ProducerMessage{Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(o.Encode()),
				Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}}
		}
		msgs = append(msgs, m())
		if rng.Float64() < dupRate {
			msgs = append(msgs, m())
		}
	}
	for i := range msgs { // copies arrive a little later, not adjacent
		j := i + rng.IntN(min(len(msgs)-i, 50))
		msgs[i], msgs[j] = msgs[j], msgs[i]
	}
	return msgs
}

func sendAll(p sarama.SyncProducer, topic string, msgs []*sarama.ProducerMessage) error {
	for i := 0; i < len(msgs); i += 500 {
		batch := msgs[i:min(i+500, len(msgs))]
		for _, m := range batch {
			m.Topic = topic
		}
		if err := p.SendMessages(batch); err != nil {
			return err
		}
	}
	return nil
}

// benchSeedLoad measures mode "batch" (the router's default: group commit, each delivery's
// three calls made by the plugin's Prepare as soon as it arrives) or "single" (one delivery
// at a time, Prepare's calls before its transaction). Both bounded by
// inbox.max_in_flight_calls.
func (s *suite) benchSeedLoad(ctx context.Context, mode string) error {
	db, kc := s.db, s.kc
	if err := s.truncate(ctx); err != nil {
		return err
	}
	const parts = 12
	in, cleanIn, err := makeTopic(kc, "bench-seed-order-paid", parts)
	if err != nil {
		return err
	}
	defer cleanIn()
	cfg := coupon.DefaultConfig()
	cfg.GrantedTopic, cfg.FailedTopic = "bench-unrelayed-granted", "bench-unrelayed-failed"
	cfg.StockTotal, cfg.BudgetCents = int64(s.cfg.seedOrders)*2, int64(s.cfg.seedOrders)*2*cfg.ValueCents
	if err := coupon.EnsureCampaign(ctx, db, cfg); err != nil {
		return err
	}
	svc := &countingService{svc: newSimulatedCalls(s.cfg.scaled(s.cfg.seedDelay), s.cfg.scaled(s.cfg.seedJitter), 1)}
	g, err := coupon.NewGranter(cfg, svc, nil)
	if err != nil {
		return err
	}
	h, err := g.Handler(db) // a Preparer: the calls are slow
	if err != nil {
		return err
	}
	defer h.(io.Closer).Close()
	// The router's defaults, unless a -seed-* flag says otherwise.
	pc := kafkax.ParallelConfig{Window: s.cfg.seedWindow, MaxInFlightBytes: s.cfg.seedBudget}.WithDefaults()
	ic := engine.Config{BizType: coupon.BizType, MaxInFlightCalls: s.cfg.seedInFlight}.WithDefaults()
	calls := ic.MaxInFlightCalls
	ib, err := engine.New(db, h, ic, nil, nil)
	if err != nil {
		return err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	msgs := seedMessages("seed", s.cfg.seedOrders, s.cfg.seedDupRate, rand.New(rand.NewPCG(1, 2)))
	if err := sendAll(producer, in, msgs); err != nil {
		return err
	}

	var claims atomic.Int64
	sub, err := kc.NewParallelSubscriber("bench-"+in, pc, claimCounter{LoggerAdapter: watermill.NopLogger{}, claims: &claims})
	if err != nil {
		return err
	}
	handler := ib.HandlerFunc(in)
	var b *engine.Batcher
	if mode == "batch" {
		if b, err = ib.NewBatcher(engine.BatchConfig{}); err != nil {
			return err
		}
		handler = b.HandlerFunc(in)
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	r.AddMiddleware(kafkax.AckOnReturn) // as the router binary does
	r.AddConsumerHandler("seed", in, sub, handler)
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(cctx) })
	<-r.Running()
	cpu := newCPUMeter(s.services)
	start := time.Now()
	var granted, peakRecords int
	for granted < s.cfg.seedOrders {
		time.Sleep(250 * time.Millisecond)
		n := 0
		for _, st := range sub.PartitionStats() {
			n += st.InFlight
		}
		peakRecords = max(peakRecords, n)
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM user_coupon").Scan(&granted); err != nil {
			cancel()
			return err
		}
		if time.Since(start) > 15*time.Minute {
			cancel()
			return fmt.Errorf("seed_load: %d of %d orders granted after 15 minutes", granted, s.cfg.seedOrders)
		}
	}
	el := time.Since(start)
	cancel()
	wg.Wait()
	var st engine.BatchStats
	if b != nil {
		_ = b.Close()
		st = b.Stats()
	}
	var dupCoupons int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM user_coupon").Scan(&dupCoupons); err != nil {
		return err
	}
	// The bound: calls in flight ÷ the time one order's three calls take on average; for a
	// run of N orders, N ÷ (N ÷ that rate + one order's calls), as the first orders' calls
	// start together and the last ones finish alone.
	perOrder := 3 * (s.cfg.scaled(s.cfg.seedDelay) + s.cfg.scaled(s.cfg.seedJitter)/2)
	// Records in flight: the window's, the budget's (a record's bytes and RecordOverhead)
	// and the calls' limits.
	recBytes := int64(len(msgs[0].Value.(sarama.ByteEncoder))+len(string(msgs[0].Key.(sarama.StringEncoder)))+100) + kafkax.RecordOverhead
	inFlight := min(calls, pc.Window*parts, int(pc.MaxInFlightBytes/recBytes), s.cfg.seedOrders)
	bound := float64(inFlight) / perOrder.Seconds()
	runBound := float64(s.cfg.seedOrders) / (float64(s.cfg.seedOrders)/bound + perOrder.Seconds())
	rate := float64(s.cfg.seedOrders) / el.Seconds()
	s.report("seed_load", append([]any{"mode", mode, "orders", s.cfg.seedOrders, "deliveries", len(msgs), "scale", fmt.Sprint(s.cfg.seedScale), "orders_per_s", rate,
		"seconds", el.Seconds(), "peak_calls_in_flight", svc.peak.Load(), "max_in_flight_calls", calls,
		"window", pc.Window, "budget_mb", pc.MaxInFlightBytes >> 20, "peak_records_in_flight", peakRecords,
		"bound_orders_per_s", bound, "run_bound_orders_per_s", runBound, "pct_of_run_bound", rate / runBound * 100, "calls", svc.calls.Load(), "rebalances", claims.Load() - parts, "duplicate_coupons", dupCoupons,
		"prepared", st.Prepared, "prepare_skipped", st.PrepareSkipped, "batches", st.Batches, "fallbacks", st.Fallbacks}, cpu.perOrder(s.cfg.seedOrders)...)...)
	if mode != "batch" {
		return nil
	}
	// Beside it, on the same records: the write-up's consumer as it was (500 records per
	// poll) and after its fix (20).
	for _, recs := range []int{500, 20} {
		if err := s.benchSeedConsumer(ctx, in, recs); err != nil {
			return fmt.Errorf("seed_consumer: %w", err)
		}
	}
	return nil
}

// benchSeedConsumer runs the write-up's first consumer on the run's topic for
// -seed-consumer-seconds: records one after another (three calls of 0.8–2 s, then a plain
// insert of the coupon: no dedup), up to recsPerPoll per poll, offsets committed after
// the poll's records. A poll whose records took longer than max.poll.interval is a member
// kicked out of its group: its commit fails, and after the rebalance the partitions are
// read again from the last committed offsets — so the poll's records are granted again.
//
// Modelled on the Java consumer's poll loop over real partition consumers of the broker
// (Sarama has no max.poll.interval); times scaled by -seed-consumer-scale, and the
// orders/s reported scaled back to the incident's call times.
func (s *suite) benchSeedConsumer(ctx context.Context, topic string, recsPerPoll int) error {
	db, kc := s.db, s.kc
	if _, err := s.lock.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS naive_coupon (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(64) NOT NULL)"); err != nil {
		return err
	}
	if err := s.grantOwn(ctx, "naive_coupon"); err != nil {
		return err
	}
	if _, err := s.lock.ExecContext(ctx, "TRUNCATE TABLE naive_coupon"); err != nil {
		return err
	}
	f := s.cfg.seedConsumerScale
	svc := newSimulatedCalls(time.Duration(float64(s.cfg.seedDelay)*f), time.Duration(float64(s.cfg.seedJitter)*f), 3)
	interval := time.Duration(float64(s.cfg.seedConsumerInterval) * f)
	client, err := sarama.NewClient(kc.Brokers, kc.ConsumerConfig())
	if err != nil {
		return err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return err
	}
	committed := map[int32]int64{}
	for _, p := range parts {
		committed[p] = sarama.OffsetOldest
	}
	// open starts partition consumers at the committed offsets (a rejoined member's view).
	open := func() (sarama.Consumer, chan *sarama.ConsumerMessage, error) {
		c, err := sarama.NewConsumerFromClient(client)
		if err != nil {
			return nil, nil, err
		}
		out := make(chan *sarama.ConsumerMessage, 1024)
		for _, p := range parts {
			pc, err := c.ConsumePartition(topic, p, committed[p])
			if err != nil {
				c.Close()
				return nil, nil, err
			}
			go func() {
				for m := range pc.Messages() {
					out <- m
				}
			}()
		}
		return c, out, nil
	}
	consumer, records, err := open()
	if err != nil {
		return err
	}
	defer func() { consumer.Close() }()
	var rebalances, polls int
	start := time.Now()
	deadline := start.Add(s.cfg.seedNaiveFor)
	for time.Now().Before(deadline) {
		// poll: up to recsPerPoll records, waiting at most 100 ms for more.
		var batch []*sarama.ConsumerMessage
		wait := time.After(100 * time.Millisecond)
	poll:
		for len(batch) < recsPerPoll {
			select {
			case m := <-records:
				batch = append(batch, m)
			case <-wait:
				break poll
			}
		}
		polls++
		pollStart := time.Now()
		for _, m := range batch {
			o, err := coupon.DecodeOrderPaid(m.Value)
			if err != nil {
				continue
			}
			for _, step := range seedSteps {
				_ = svc.Call(ctx, step, o.OrderID+":"+step)
			}
			if _, err := db.ExecContext(ctx, "INSERT INTO naive_coupon (order_id) VALUES (?)", o.OrderID); err != nil {
				return err
			}
		}
		if time.Since(pollStart) > interval {
			// Kicked out mid-poll: the commit fails, the partitions are re-read from the last
			// committed offsets.
			rebalances++
			consumer.Close()
			if consumer, records, err = open(); err != nil {
				return err
			}
			continue
		}
		for _, m := range batch {
			committed[m.Partition] = m.Offset + 1
		}
	}
	el := time.Since(start)
	var coupons, distinct int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT order_id) FROM naive_coupon").Scan(&coupons, &distinct); err != nil {
		return err
	}
	s.report("seed_consumer", "records_per_poll", recsPerPoll, "scale", fmt.Sprint(f), "poll_interval_s", interval.Seconds(), "seconds", el.Seconds(),
		"polls", polls, "rebalances", rebalances, "orders", distinct, "coupons", coupons, "duplicate_coupons", coupons-distinct,
		"orders_per_s_unscaled", fmt.Sprintf("%.2f", float64(distinct)/el.Seconds()*f))
	return nil
}

// seedSteps name the three calls of a grant (the seed's user, marketing and notification
// centres).
var seedSteps = []string{"lock-stock", "deduct-budget", "issue-coupon"}

// seedGroup measures the incident's own load (seed_load): every grant calls three outside services of
// 0.8–2 s each, orders arrive in bursts of 500 with 30 % duplicate deliveries. onceflow's
// router path (parallel subscriber, Batcher preparing each delivery as it arrives, group
// commit) against it, and beside it the write-up's first consumer (seed_consumer): records
// one after another, grant then ack, 500 records per poll, a member that overruns the poll
// interval is kicked and its partitions re-read. Both modes of benchSeedLoad; the seed
// consumer runs beside the first.
func (s *suite) seedGroup(ctx context.Context) error {
	s.calibrate("before_seed")
	for _, mode := range strings.Split(s.cfg.seedModes, ",") {
		if err := s.benchSeedLoad(ctx, mode); err != nil {
			return fmt.Errorf("seed_load %s: %w", mode, err)
		}
	}
	return nil
}

package onceflow

import (
	"context"
	"database/sql"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// RunRelay runs the outbox relay of relay.* alone, as `router relay` does. It runs until
// ctx is cancelled or the relay fails. It starts a list of parts in order and stops them in
// reverse: the pool, tracing, the metrics, the admin listener and the relay. So the relay
// stops before the admin listener, the tracing flush and the pool. RunRelay returns nil
// after a cancellation. It refuses bad relay.* settings as bad input before it connects.
func (s *Setup) RunRelay(ctx context.Context) error {
	p := &pipeline{s: s, kc: s.Kafka()}
	if err := p.kc.Validate(); err != nil {
		return BadInput(err)
	}
	if _, err := s.relayConfig(); err != nil { // bad relay.* settings are bad input, before connecting
		return err
	}
	tables := []string{"outbox"}
	if s.Config.Relay.ExactlyOnce {
		tables = append(tables, outbox.LeaseTable)
	}
	if s.Config.Relay.Shards > 1 {
		tables = append(tables, outbox.MemberTable)
	}
	s.logger.Info("relay starting", watermill.LogFields{"dsn": dbx.MaskDSN(s.Config.DB.DSN), "brokers": p.kc.Brokers,
		"exactly_once": s.Config.Relay.ExactlyOnce, "shard": s.Config.Relay.Shard, "shards": s.Config.Relay.Shards, "gc": s.gc})
	return runParts(ctx, s.logger, []part{
		{name: "database",
			start: func(ctx context.Context) (err error) {
				p.db, err = s.OpenDB(ctx, 0, tables...)
				return err
			},
			stop: func() { _ = p.db.Close() }},
		s.tracing(), // the relay built after it traces with it
		{name: "metrics",
			start: func(context.Context) error {
				p.m = metrics.New(p.db)
				p.m.AddLagBound(s.Config.Relay.LagBound)
				return nil
			}},
		p.admin(),
		p.relay(),
	})
}

// relay publishes the outbox as relay.* configures it. The relay retries a batch that
// failed, and a database or a broker it cannot reach. Its run ends when it is stopped, or
// on a check that no retry fixes, such as a pool not at READ COMMITTED. Stopping it ends
// its exactly-once session and releases its lease.
func (p *pipeline) relay() part {
	var (
		relay                   *outbox.Relay
		closeRelay, stopMetrics func()
	)
	return part{name: "relay",
		start: func(ctx context.Context) error {
			var err error
			relay, closeRelay, err = p.s.newRelay(p.db, p.kc, p.obs != nil)
			if err != nil {
				return err
			}
			if p.obs != nil {
				p.obs.wake = relay.Wake // set before the router starts delivering
			}
			stopMetrics = relayMetrics(context.WithoutCancel(ctx), p.m, relay) // counts until the relay has stopped
			return nil
		},
		run: func(ctx context.Context) error { return relay.Run(ctx) },
		stop: func() {
			stopMetrics()
			closeRelay()
			p.s.logger.Info("relay stopped", watermill.LogFields{"published": relay.Published(), "reconciled": relay.Reconciled()})
		},
	}
}

// relayIdlePollMax is how long the relay of `router run` waits at most between reads once
// it has been idle for a while (outbox.RelayConfig.IdlePollMax): the deliveries and the
// redeliveries of the process wake it for their rows, so only rows that other processes
// commit wait for its next read. `router relay`, which nothing wakes, polls every
// relay.poll_interval.
const relayIdlePollMax = time.Second

// relayConfig is the relay's config of relay.*. Unless relay.transactional_id names one, it
// adds the transactional id of this database and shard. It adds the tracer and the crash
// hook of a chaos build, from internal/faults.
func (s *Setup) relayConfig() (outbox.RelayConfig, error) {
	rc := s.Config.Relay.RelayConfig
	if rc.TransactionalID == "" {
		// Each database and shard has its own transactional id. So relays of two databases,
		// such as a demo and production, never fence each other. Only relays of the same
		// database read a position back.
		info, err := dbx.ParseDSNInfo(s.Config.DB.DSN)
		if err != nil {
			return outbox.RelayConfig{}, BadInput(err)
		}
		rc.TransactionalID = outbox.DefaultTransactionalID(info.DBName, rc.WithDefaults().Shard)
	}
	rc.Hook, rc.TracerProvider = faults.RelayPoint(), s.Config.tracing
	if err := rc.WithDefaults().Validate(); err != nil {
		return outbox.RelayConfig{}, BadInput(err)
	}
	return rc, nil
}

// newRelay builds the configured relay. The exactly-once relay has a transactional producer
// and a lease. The at-least-once relay has an idempotent producer. The returned func
// releases what the relay holds.
func (s *Setup) newRelay(db *sql.DB, kc kafkax.Config, woken bool) (*outbox.Relay, func(), error) {
	rc, err := s.relayConfig()
	if err != nil {
		return nil, nil, err
	}
	if woken {
		rc.IdlePollMax = relayIdlePollMax
	}
	if s.Config.Relay.ExactlyOnce {
		r, err := outbox.NewExactlyOnceRelay(db, kc, rc, s.logger)
		if err != nil {
			return nil, nil, BadInput(err)
		}
		return r, func() { _ = r.Close() }, nil
	}
	// The producer's own client answers the relay's check before each batch. The check
	// finds whether the topics exist and the records fit Producer.MaxMessageBytes. So the
	// relay parks what Kafka would refuse, unsent.
	pc := kc.ProducerConfig()
	client, err := sarama.NewClient(kc.Brokers, pc)
	if err != nil {
		return nil, nil, kafkax.Unreachable(kc.Brokers, err)
	}
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, kafkax.Unreachable(kc.Brokers, err)
	}
	closeAll := func() {
		_ = producer.Close()
		_ = client.Close()
	}
	r, err := outbox.NewRelay(db, producer, rc, s.logger)
	if err != nil {
		closeAll()
		return nil, nil, BadInput(err)
	}
	r.CheckWith(client, pc.Producer.MaxMessageBytes)
	s.logger.Info("relay runs AT LEAST ONCE (relay.exactly_once=false): a crash between Kafka's ack and the database mark republishes that batch", nil)
	return r, closeAll, nil
}

// relayMetrics feeds the relay's counters into the registry and adds its state gauges.
func relayMetrics(ctx context.Context, m *metrics.Metrics, relay *outbox.Relay) (stop func()) {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "onceflow", Name: "relay_exactly_once",
			Help: "1 when the relay runs in exactly-once (transactional) mode."}, func() float64 { return b2f(relay.ExactlyOnce()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "onceflow", Name: "relay_lease_owner",
			Help: "1 while this relay holds its shard's lease and publishes."}, func() float64 { return b2f(relay.Owner()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "onceflow", Name: "relay_fenced",
			Help: "1 when this relay was fenced by another producer with its transactional.id and has stopped publishing."},
			func() float64 { return b2f(relay.Fenced()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "onceflow", Name: "relay_shards_owned",
			Help: "Outbox shards whose lease this relay holds (relay.shards)."}, func() float64 { return float64(len(relay.OwnedShards())) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_lease_takeovers_total",
			Help: "Shard leases this relay took (at start, from an expired or released owner, or back after losing one); renewals do not count."},
			func() float64 { return float64(relay.LeaseTakeovers()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_fencings_total",
			Help: "Times this relay was fenced."}, func() float64 { return float64(relay.Fencings()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_reconciled_total",
			Help: "Rows found already committed to Kafka at session start and marked without republishing."},
			func() float64 { return float64(relay.Reconciled()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_batches_total",
			Help: "Batches published: Kafka transactions in exactly-once mode (relay.batch_size and relay.linger shape them)."},
			func() float64 { return float64(relay.Batches()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_handoff_events_total",
			Help: "Committed events the router's batches handed to its exactly-once relay in memory (relay.handoff_bytes)."},
			func() float64 { return float64(relay.HandOff().Handed) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_handoff_full_total",
			Help: "Committed events not handed over: the hand-off was full, or their shard is published by another process (the relay reads them back)."},
			func() float64 { return float64(relay.HandOff().Full) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_handoff_batches_total",
			Help: "Batches whose rows the exactly-once relay took from the hand-off instead of reading them back."},
			func() float64 { return float64(relay.HandOff().Batches) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_readback_batches_total",
			Help: "Batches the exactly-once relay read in full from the database (with the hand-off on: a row of theirs was not handed over)."},
			func() float64 { return float64(relay.HandOff().ReadBack) }),
		parkedCollector{relay},
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "onceflow", Name: "relay_cleaned_total",
			Help: "Published outbox rows deleted after relay.retention."}, func() float64 { return float64(relay.Deleted()) }),
	)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var lastPub, lastErr int64
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				n, e := relay.Published(), relay.Failures()
				m.RelayPublished.Add(float64(n - lastPub))
				m.RelayErrors.Add(float64(e - lastErr))
				lastPub, lastErr = n, e
			}
		}
	}()
	return func() { cancel(); <-done }
}

// parkedDesc is onceflow_relay_parked_total, by the reason the relay parked each event.
var parkedDesc = prometheus.NewDesc("onceflow_relay_parked_total",
	"Outbox events this relay parked, by reason: Kafka refuses them for good (unknown_topic, too_large, invalid_record, unauthorized), or they wait behind one of their key that it refuses (held); router outbox ls lists them.",
	[]string{"reason"}, nil)

// parkedCollector exports the relay's parked events by reason. Every reason is exported
// from the start.
type parkedCollector struct{ relay *outbox.Relay }

func (c parkedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- parkedDesc }

func (c parkedCollector) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.relay.ParkedBy() {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.CounterValue, float64(n), reason)
	}
}

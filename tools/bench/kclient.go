package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// kclientGroup measures the Kafka client alone, Sarama against franz-go (kgo), doing what the
// router asks of it: consume -kclient-records order-paid records in a consumer group as
// kafkax configures it (read_committed, its fetch sizes, each record's offset marked and
// auto-committed every second, the marks committed at the end), and produce them in Kafka
// transactions of -relay-batch records as the exactly-once relay's producer does (idempotent,
// acks=all, one request in flight, no compression, the flush wait as linger, Sarama's key
// hash). No Watermill, no database. CPU is this process's user + system time over the timed
// part: from the client's creation until the last record is read and its offset committed,
// or the last transaction committed (closing the client is left out). Two more consumers read
// the same records through what the router binary puts on top of Sarama (routerConsume):
// "router", its handler returning at once, and "router_wait", its handler waiting in batches
// as group commit's deliveries do. "loop" does both at once, as a batch-native pipeline with
// its events and offsets in one transaction would (kclientloop.go). -kclient-rounds rounds,
// alternating the order; medians, and kgo's CPU per record in % of Sarama's.
func (s *suite) kclientGroup(ctx context.Context) error {
	n, rounds, batch := s.cfg.kclientN, s.cfg.kclientRounds, s.cfg.relayBatch
	in, dropIn, err := makeTopic(s.kc, "bench-kclient-in", 12)
	if err != nil {
		return fmt.Errorf("kclient: %w", err)
	}
	defer dropIn()
	out, dropOut, err := makeTopic(s.kc, "bench-kclient-out", 12)
	if err != nil {
		return fmt.Errorf("kclient: %w", err)
	}
	defer dropOut()
	recs := kclientRecords(n)
	if err := s.kclientLoad(in, recs); err != nil {
		return fmt.Errorf("kclient: load %s: %w", in, err)
	}
	fmt.Printf("bench: kclient: %d records of %d B on average (key, %d B value, 2 headers) on %s, 12 partitions\n",
		n, recs[0].size(), len(recs[0].value), in)

	type key struct{ client, op string }
	perS, cpu, broker := map[key][]float64{}, map[key][]float64{}, map[key][]float64{}
	clients := []string{"sarama", "kgo", "router", "router_wait"}
	us := func(v float64) string { return fmt.Sprintf("%.2f", v) } // a few µs per record: one decimal is too coarse
	for r := 1; r <= rounds; r++ {
		s.round = r
		order := slices.Clone(clients)
		if r%2 == 0 {
			slices.Reverse(order)
		}
		for _, op := range []string{"consume", "produce", "loop"} {
			for _, c := range order {
				var m kclientRun
				switch {
				case op == "loop" && c == "sarama":
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.saramaLoop(ctx, in, out, n, t) })
				case op == "loop" && c == "kgo":
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.kgoLoop(ctx, in, out, n, t) })
				case op == "loop":
					continue
				case op == "consume" && c == "sarama":
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.saramaConsume(ctx, in, n, t) })
				case op == "consume" && c == "router":
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.routerConsume(ctx, in, n, t, false) })
				case op == "consume" && c == "router_wait":
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.routerConsume(ctx, in, n, t, true) })
				case op == "consume":
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.kgoConsume(ctx, in, n, t) })
				case c == "router" || c == "router_wait":
					continue
				case c == "sarama":
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.saramaProduce(out, recs, batch, t) })
				default:
					m, err = s.kclientTimed(n, func(t *kclientTimer) error { return s.kgoProduce(ctx, out, recs, batch, t) })
				}
				if err != nil {
					s.round = 0
					return fmt.Errorf("kclient %s %s: %w", c, op, err)
				}
				k := key{c, op}
				perS[k], cpu[k], broker[k] = append(perS[k], m.perS), append(cpu[k], m.cpuUS), append(broker[k], m.kafkaUS)
				kv := []any{"client", c, "op", op, "records", n, "records_per_s", m.perS, "cpu_us_per_record", us(m.cpuUS),
					"kafka_cpu_us_per_record", m.kafkaUS, "seconds", m.elapsed.Seconds()}
				if op != "produce" {
					kv = append(kv, "start_ms", m.start.Milliseconds())
				}
				if op == "loop" {
					kv = append(kv, "records_per_txn", float64(n)/float64(max(m.txns, 1)))
				}
				s.report("kclient", kv...)
			}
		}
	}
	s.round = 0
	for _, op := range []string{"consume", "produce", "loop"} {
		for _, c := range clients {
			k := key{c, op}
			if len(cpu[k]) == 0 {
				continue
			}
			kv := []any{"client", c, "op", op, "records", n, "records_per_s", median(perS[k]), "cpu_us_per_record", us(median(cpu[k])),
				"cpu_min", us(slices.Min(cpu[k])), "cpu_max", us(slices.Max(cpu[k])), "kafka_cpu_us_per_record", median(broker[k]), "rounds", rounds}
			switch op {
			case "produce":
				kv = append(kv, "records_per_txn", batch)
			case "loop":
				kv = append(kv, "max_records_per_txn", s.kclientLoopMax())
			}
			s.report("kclient", kv...)
		}
	}
	pct := func(op string) float64 { return 100 * median(cpu[key{"kgo", op}]) / median(cpu[key{"sarama", op}]) }
	saved := func(op string) float64 { return median(cpu[key{"sarama", op}]) - median(cpu[key{"kgo", op}]) }
	// Each order is one consumed record and one produced event: the client's saving per record
	// on both sides bounds what kgo could take off the router's CPU per order.
	s.report("ratio", "mode", "kgo_vs_sarama", "consume_cpu_pct", pct("consume"), "produce_cpu_pct", pct("produce"),
		"router_saving_us_per_order_bound", us(saved("consume")+saved("produce")), "loop_cpu_pct", pct("loop"),
		"loop_saving_us_per_order", us(saved("loop")), "rounds", rounds)
	return nil
}

// kclientRecord is one record of the kclient group: an order-paid record as the e2e producer
// makes them (the order id as key, the order's JSON, Watermill's message uuid and a
// traceparent as headers), held as bytes so that each client builds its own messages from
// them inside the timed part.
type kclientRecord struct {
	key, value []byte
	headers    [2][]byte // the values of kclientHeaders
}

// kclientHeaders are the records' header keys, in each client's type, made once (as a relay
// names its headers by constants).
var kclientHeaders = [2]string{wkafka.UUIDHeaderKey, tracex.Header}
var kclientHeaderBytes = [2][]byte{[]byte(kclientHeaders[0]), []byte(kclientHeaders[1])}

func (r kclientRecord) size() int {
	n := len(r.key) + len(r.value)
	for i, h := range r.headers {
		n += len(kclientHeaders[i]) + len(h)
	}
	return n
}

func kclientRecords(n int) []kclientRecord {
	recs := make([]kclientRecord, n)
	for i := range recs {
		o := order("kclient", i)
		recs[i] = kclientRecord{key: []byte(o.OrderID), value: o.Encode(),
			headers: [2][]byte{[]byte(watermill.NewUUID()), []byte(traceParentOf(i, true))}}
	}
	return recs
}

func (r kclientRecord) sarama(topic string) *sarama.ProducerMessage {
	return &sarama.ProducerMessage{Topic: topic, Key: sarama.ByteEncoder(r.key), Value: sarama.ByteEncoder(r.value),
		Headers: []sarama.RecordHeader{{Key: kclientHeaderBytes[0], Value: r.headers[0]}, {Key: kclientHeaderBytes[1], Value: r.headers[1]}}}
}

func (r kclientRecord) kgo() *kgo.Record {
	return &kgo.Record{Key: r.key, Value: r.value,
		Headers: []kgo.RecordHeader{{Key: kclientHeaders[0], Value: r.headers[0]}, {Key: kclientHeaders[1], Value: r.headers[1]}}}
}

// kclientLoad puts recs on topic with the bench's producer (kafkax's idempotent one, 500
// records per request, as the e2e runs load their orders).
func (s *suite) kclientLoad(topic string, recs []kclientRecord) error {
	p, err := s.kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer p.Close()
	for start := 0; start < len(recs); start += 500 {
		msgs := make([]*sarama.ProducerMessage, 0, 500)
		for _, r := range recs[start:min(start+500, len(recs))] {
			msgs = append(msgs, r.sarama(topic))
		}
		if err := p.SendMessages(msgs); err != nil {
			return err
		}
	}
	return nil
}

// kclientRun is one timed run: records/s, this process's CPU µs per record, the broker's,
// and for a consumer the time from the client's creation to its first record (group join,
// first fetch).
type kclientRun struct {
	perS, cpuUS, kafkaUS float64
	elapsed, start       time.Duration
	txns                 int // transactions of a loop run
}

// kclientTimer times a run: from its creation until end, which the run calls before it
// closes its client; first marks the first record read.
type kclientTimer struct {
	n            int
	kafkaPID     string
	cpu0, kafka0 time.Duration
	began        time.Time
	firstAfter   atomic.Int64 // since began, in ns; 0 until the first record
	run          kclientRun
	ended        bool
	txns         int // a loop run's committed transactions
}

func (t *kclientTimer) first() { t.firstAfter.CompareAndSwap(0, int64(time.Since(t.began))) }

func (t *kclientTimer) end() {
	el, cpu, kafka := time.Since(t.began), selfCPU()-t.cpu0, procCPU(t.kafkaPID)-t.kafka0
	t.run = kclientRun{perS: float64(t.n) / el.Seconds(), cpuUS: float64(cpu.Microseconds()) / float64(t.n), elapsed: el}
	if t.kafkaPID != "" {
		t.run.kafkaUS = float64(kafka.Microseconds()) / float64(t.n)
	}
	t.run.start = time.Duration(t.firstAfter.Load())
	t.run.txns = t.txns
	t.ended = true
}

// kclientTimed runs fn (n records) and measures it. A collection first, so that garbage left
// by what ran before is not collected on this run's time.
func (s *suite) kclientTimed(n int, fn func(t *kclientTimer) error) (kclientRun, error) {
	runtime.GC()
	t := &kclientTimer{n: n, kafkaPID: s.services["kafka"]}
	t.kafka0, t.cpu0, t.began = procCPU(t.kafkaPID), selfCPU(), time.Now()
	if err := fn(t); err != nil {
		return kclientRun{}, err
	}
	if !t.ended {
		return kclientRun{}, errors.New("run returned without ending its timed part")
	}
	return t.run, nil
}

// selfCPU is this process's user + system CPU time (getrusage: microseconds, where /proc's
// stat counts 10 ms ticks).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// kclientGroupID is a consumer group or transactional id of the bench's own.
func kclientGroupID(client, what string) string {
	return fmt.Sprintf("bench-kclient-%s-%s-%d", client, what, time.Now().UnixNano())
}

// kclientWait bounds a run that stopped making progress.
const kclientWait = 2 * time.Minute

// saramaConsume reads n records of topic in a fresh consumer group with the router's Sarama
// consumer config (kafkax.ConsumerConfig; fetch.min.bytes is left at 1 for both clients: a
// pre-loaded topic fills every fetch), marking each record's offset as kafkax does once
// the record is acked, and committing the marks once the nth is read.
func (s *suite) saramaConsume(ctx context.Context, topic string, n int, t *kclientTimer) error {
	id := kclientGroupID("sarama", "group")
	defer s.dropGroup(id)
	group, err := sarama.NewConsumerGroup(s.kc.Brokers, id, s.kc.ConsumerConfig())
	if err != nil {
		return err
	}
	defer group.Close()
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	h := &kclientHandler{n: int64(n), t: t, done: make(chan struct{})}
	consumed := make(chan error, 1)
	go func() {
		for cctx.Err() == nil {
			if err := group.Consume(cctx, []string{topic}, h); err != nil {
				consumed <- err
				return
			}
		}
		consumed <- nil
	}()
	var groupErr atomic.Pointer[error]
	go func() { // until Close closes it
		for err := range group.Errors() {
			groupErr.Store(&err)
		}
	}()
	select {
	case <-h.done:
		t.end()
		cancel()
		<-consumed
		return nil
	case err := <-consumed:
		if err == nil {
			err = fmt.Errorf("%d of %d records read", h.read.Load(), n)
			if last := groupErr.Load(); last != nil {
				err = fmt.Errorf("%w (last group error: %w)", err, *last)
			}
		}
		return err
	}
}

// kclientHandler is the sarama.ConsumerGroupHandler of saramaConsume.
type kclientHandler struct {
	n    int64
	t    *kclientTimer
	read atomic.Int64
	done chan struct{}
}

func (h *kclientHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *kclientHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *kclientHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		sess.MarkMessage(msg, "")
		read := h.read.Add(1)
		if read == 1 {
			h.t.first()
		}
		if read == h.n {
			sess.Commit()
			close(h.done)
		}
	}
	return nil
}

// kgoConsume reads n records of topic in a fresh consumer group with kgo, set as
// kafkax.ConsumerConfig sets Sarama: read_committed, the oldest offset for a new group, the
// same fetch size per partition and fetch wait, the group's timeouts, the range balancer;
// each record's offset marked (AutoCommitMarks, committed every second) and the marks
// committed once the nth is read.
func (s *suite) kgoConsume(ctx context.Context, topic string, n int, t *kclientTimer) error {
	id := kclientGroupID("kgo", "group")
	defer s.dropGroup(id)
	cl, err := kgo.NewClient(s.kgoOpts(s.kgoGroupOpts(id, topic), []kgo.Opt{kgo.AutoCommitMarks(), kgo.AutoCommitInterval(time.Second)})...)
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	read := 0
	for read < n {
		fs := cl.PollFetches(cctx)
		if err := cctx.Err(); err != nil {
			return fmt.Errorf("%d of %d records read: %w", read, n, err)
		}
		if err := fs.Err0(); err != nil {
			return err
		}
		fs.EachRecord(func(r *kgo.Record) {
			if read == 0 {
				t.first()
			}
			cl.MarkCommitRecords(r)
			read++
		})
	}
	if err := cl.CommitMarkedOffsets(cctx); err != nil {
		return err
	}
	t.end()
	return nil
}

// dropGroup deletes a consumer group of the bench's (best effort: the group is empty once its
// client is closed).
func (s *suite) dropGroup(id string) {
	admin, err := sarama.NewClusterAdmin(s.kc.Brokers, s.kc.SaramaConfig())
	if err != nil {
		return
	}
	defer admin.Close()
	_ = admin.DeleteConsumerGroup(id)
}

// saramaProduce sends recs to topic in transactions of batch records with a Sarama
// transactional producer configured as the exactly-once relay's (outbox's eosShard
// producerConfig, which is not exported; its positions partitioner left out): begin, one
// SendMessages of the batch, commit.
func (s *suite) saramaProduce(topic string, recs []kclientRecord, batch int, t *kclientTimer) error {
	p, closeP, err := s.saramaTxnProducer("txn")
	if err != nil {
		return err
	}
	defer closeP()
	msgs := make([]*sarama.ProducerMessage, 0, batch)
	for start := 0; start < len(recs); start += batch {
		msgs = msgs[:0]
		for _, r := range recs[start:min(start+batch, len(recs))] {
			msgs = append(msgs, r.sarama(topic))
		}
		if err := p.BeginTxn(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		if err := p.SendMessages(msgs); err != nil {
			_ = p.AbortTxn()
			return err
		}
		if err := p.CommitTxn(); err != nil {
			return fmt.Errorf("commit transaction: %w", err)
		}
	}
	t.end()
	return nil
}

// kgoProduce is saramaProduce with kgo set alike: a transactional id, the same transaction
// timeout, acks=all (kgo's default), one produce request in flight, no compression (kgo's
// default is snappy), kafkax's flush wait as linger, and Sarama's key hash (fnv-1a) so that
// each record goes to the same partition; per transaction BeginTransaction, Produce,
// Flush, EndTransaction.
func (s *suite) kgoProduce(ctx context.Context, topic string, recs []kclientRecord, batch int, t *kclientTimer) error {
	cl, err := kgo.NewClient(s.kgoOpts(kgoTxnOpts("txn", topic))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	var pe produceErrs
	for start := 0; start < len(recs); start += batch {
		if err := cl.BeginTransaction(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		for _, r := range recs[start:min(start+batch, len(recs))] {
			cl.Produce(cctx, r.kgo(), pe.promise)
		}
		if err := errors.Join(cl.Flush(cctx), pe.err()); err != nil {
			_ = cl.EndTransaction(cctx, kgo.TryAbort)
			return err
		}
		if err := cl.EndTransaction(cctx, kgo.TryCommit); err != nil {
			return fmt.Errorf("commit transaction: %w", err)
		}
	}
	t.end()
	return nil
}

// kgoOpts are the options of a kgo client of the bench's brokers: the options of the parts it
// plays (kgoGroupOpts, kgoTxnOpts) and its own.
func (s *suite) kgoOpts(parts ...[]kgo.Opt) []kgo.Opt {
	kc := s.kc
	opts := []kgo.Opt{kgo.SeedBrokers(kc.Brokers...), kgo.ClientID(kc.ClientID), kgo.DialTimeout(kc.DialTimeout)}
	for _, p := range parts {
		opts = append(opts, p...)
	}
	return opts
}

// kgoGroupOpts are the options of a kgo consumer in group id reading topic, set as
// kafkax.ConsumerConfig sets Sarama (see kgoConsume).
func (s *suite) kgoGroupOpts(id, topic string) []kgo.Opt {
	kc := s.kc
	return []kgo.Opt{
		kgo.ConsumerGroup(id), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxPartitionBytes(kafkax.ConsumerFetchBytes), kgo.FetchMaxWait(kc.MaxPollWait),
		kgo.SessionTimeout(kc.SessionTimeout), kgo.RebalanceTimeout(kc.RebalanceTimeout), kgo.HeartbeatInterval(kc.HeartbeatEvery),
		kgo.Balancers(kgo.RangeBalancer()),
	}
}

// kgoTxnOpts are the options of a kgo transactional producer to topic, set as the
// exactly-once relay's Sarama producer (see kgoProduce), with a fresh transactional id.
func kgoTxnOpts(what, topic string) []kgo.Opt {
	return []kgo.Opt{
		kgo.TransactionalID(kclientGroupID("kgo", what)), kgo.TransactionTimeout(30 * time.Second),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.MaxProduceRequestsInflightPerBroker(1),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.ProducerLinger(kafkax.FlushWait),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))), kgo.DefaultProduceTopic(topic),
	}
}

// produceErrs gathers the errors of kgo's produce promises.
type produceErrs struct {
	mu   sync.Mutex
	errs error
}

func (p *produceErrs) promise(_ *kgo.Record, err error) {
	if err != nil {
		p.mu.Lock()
		p.errs = errors.Join(p.errs, err)
		p.mu.Unlock()
	}
}

func (p *produceErrs) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errs
}

// fnv32a is Sarama's default key hash (sarama.NewHashPartitioner).
func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(b)
	return h.Sum32()
}

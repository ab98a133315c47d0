package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// The kclient group's "loop" runs are the Kafka side of a batch-native pipeline with its
// events and its consumer offsets in one transaction (KIP-447): read a batch of records in a
// consumer group, then in one Kafka transaction produce one event per record (its key and
// value) and commit the batch's offsets with the group's member id and generation, so the
// broker fences a member that lost its partitions. No database. The offsets are committed
// only in the transactions, never by the consumer itself.

// kclientLoopMax is the most records one transaction of a loop run carries: -relay-batch,
// the relay's batch size.
func (s *suite) kclientLoopMax() int { return max(s.cfg.relayBatch, 1) }

// saramaLoop is the loop with Sarama: a consumer group as kafkax configures it, without
// auto-commit; each claim hands its records to one loop, which takes what is there (up to
// kclientLoopMax) and runs BeginTxn, SendMessages, AddOffsetsToTxnWithGroupMetadata (the
// session's member id and generation), CommitTxn. The producer is set as saramaProduce's.
func (s *suite) saramaLoop(ctx context.Context, in, out string, n int, t *kclientTimer) error {
	id := kclientGroupID("sarama", "loop")
	defer s.dropGroup(id)
	cc := s.kc.ConsumerConfig()
	cc.Consumer.Offsets.AutoCommit.Enable = false
	group, err := sarama.NewConsumerGroup(s.kc.Brokers, id, cc)
	if err != nil {
		return err
	}
	defer group.Close()
	p, closeP, err := s.saramaTxnProducer("loop")
	if err != nil {
		return err
	}
	defer closeP()
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	h := &loopHandler{recs: make(chan *sarama.ConsumerMessage, kafkax.ConsumerFetchBytes/64), sess: make(chan sarama.ConsumerGroupSession, 1)}
	consumed := make(chan error, 1)
	go func() {
		for cctx.Err() == nil {
			if err := group.Consume(cctx, []string{in}, h); err != nil {
				consumed <- err
				return
			}
		}
		consumed <- nil
	}()
	go func() { // until Close closes it
		for range group.Errors() {
		}
	}()
	var sess sarama.ConsumerGroupSession
	select {
	case sess = <-h.sess:
	case err := <-consumed:
		return fmt.Errorf("no session: %v", err)
	}
	meta := sarama.NewConsumerGroupMetadataFromSession(sess, id, nil)
	done, batch := 0, make([]*sarama.ConsumerMessage, 0, s.kclientLoopMax())
	msgs := make([]*sarama.ProducerMessage, 0, s.kclientLoopMax())
	for done < n {
		batch = batch[:0]
		select {
		case m := <-h.recs:
			batch = append(batch, m)
		case <-cctx.Done():
			return fmt.Errorf("%d of %d records committed: %w", done, n, cctx.Err())
		}
		if done == 0 {
			t.first()
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case m := <-h.recs:
				batch = append(batch, m)
			default:
				break more
			}
		}
		msgs = msgs[:0]
		offsets := map[int32]int64{}
		for _, m := range batch {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: out, Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value)})
			offsets[m.Partition] = max(offsets[m.Partition], m.Offset+1)
		}
		pos := make([]*sarama.PartitionOffsetMetadata, 0, len(offsets))
		for part, off := range offsets {
			pos = append(pos, &sarama.PartitionOffsetMetadata{Partition: part, Offset: off})
		}
		if err := p.BeginTxn(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		if err := p.SendMessages(msgs); err != nil {
			_ = p.AbortTxn()
			return err
		}
		if err := p.AddOffsetsToTxnWithGroupMetadata(map[string][]*sarama.PartitionOffsetMetadata{in: pos}, meta); err != nil {
			_ = p.AbortTxn()
			return fmt.Errorf("offsets to transaction: %w", err)
		}
		if err := p.CommitTxn(); err != nil {
			return fmt.Errorf("commit transaction: %w", err)
		}
		done += len(batch)
		t.txns++
	}
	t.end()
	cancel()
	<-consumed
	return nil
}

// loopHandler hands every claim's records to saramaLoop, and the first session.
type loopHandler struct {
	recs chan *sarama.ConsumerMessage
	sess chan sarama.ConsumerGroupSession
	once sync.Once
}

func (h *loopHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.once.Do(func() { h.sess <- s })
	return nil
}
func (h *loopHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *loopHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		select {
		case h.recs <- m:
		case <-sess.Context().Done():
			return nil
		}
	}
	return nil
}

// saramaTxnProducer is a Sarama transactional producer set as the exactly-once relay's (see
// saramaProduce).
func (s *suite) saramaTxnProducer(what string) (sarama.SyncProducer, func(), error) {
	sc := s.kc.ProducerConfig()
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = kclientGroupID("sarama", what)
	sc.Producer.Transaction.Timeout = 30 * time.Second // outbox.RelayConfig's TxnTimeout
	sc.Producer.Transaction.Retry.Max = 20
	sc.Producer.Transaction.Retry.BackoffFunc = func(retries, _ int) time.Duration {
		return min(5*time.Millisecond<<min(retries, 7), 500*time.Millisecond)
	}
	sc.Metadata.Retry.Max = 1
	sc.Producer.Flush.MaxMessages = 0
	client, err := sarama.NewClient(s.kc.Brokers, sc)
	if err != nil {
		return nil, nil, err
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return p, func() { _ = p.Close(); _ = client.Close() }, nil
}

// kgoLoop is the loop with kgo's GroupTransactSession, set as kgoConsume's consumer and
// kgoProduce's producer (without auto-commit, which a transactional session has none of):
// PollRecords of up to kclientLoopMax, Begin, Produce each event, End with TryCommit, which
// flushes, adds the polled offsets with the group's member id and generation, and commits.
func (s *suite) kgoLoop(ctx context.Context, in, out string, n int, t *kclientTimer) error {
	id := kclientGroupID("kgo", "loop")
	defer s.dropGroup(id)
	sess, err := kgo.NewGroupTransactSession(s.kgoOpts(s.kgoGroupOpts(id, in), kgoTxnOpts("loop-txn", out))...)
	if err != nil {
		return err
	}
	defer sess.Close()
	cctx, cancel := context.WithTimeout(ctx, kclientWait)
	defer cancel()
	var pe produceErrs
	done := 0
	for done < n {
		fs := sess.PollRecords(cctx, s.kclientLoopMax())
		if err := cctx.Err(); err != nil {
			return fmt.Errorf("%d of %d records committed: %w", done, n, err)
		}
		if err := fs.Err0(); err != nil {
			return err
		}
		if fs.NumRecords() == 0 {
			continue
		}
		if done == 0 {
			t.first()
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			sess.Produce(cctx, &kgo.Record{Key: r.Key, Value: r.Value}, pe.promise)
		})
		committed, err := sess.End(cctx, kgo.TryCommit) // aborts instead when a record failed
		if err = errors.Join(err, pe.err()); err != nil {
			return fmt.Errorf("end transaction: %w", err)
		}
		if committed {
			done += fs.NumRecords()
			t.txns++
		}
	}
	t.end()
	return nil
}

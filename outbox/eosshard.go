package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// eosShard is one shard of an eosRelay, with its lease, its sessions and its batches.
//
// A session starts once this instance holds the shard's lease. It starts a new
// transactional producer with the shard's fixed transactional.id. The producer's
// InitProducerID fences any earlier producer. It aborts that producer's open transaction,
// or completes one that was already committing. The session then commits an "init"
// position in its own transaction. It reads the positions topic with read_committed
// isolation up to that record, to find the last committed batch position. It marks that
// batch's rows published if they are not yet. This step is the reconciliation. Only then
// does the session publish.
//
// Each batch starts with a plain read of the oldest unpublished rows. The read takes no
// locks, because only the lease owner publishes. One Kafka transaction carries the events
// and the batch position. After its commit, a short database transaction marks the rows. A
// batch is marked before the next one commits. So at most the last committed batch can be
// unmarked, and that is the one the next relay session reconciles. Any failure ends the
// session, which aborts the transaction and closes the producer. The next relay session
// starts from the reconciliation again.
//
// Under Run, the batches are pipelined. The mark of batch N runs while batch N+1 is read
// and sent. The read leaves out batch N's rows, and batch N+1's Kafka commit waits for
// batch N's mark. So the invariant above holds. The mark, an indexed update per row, is
// the relay's largest cost. Overlapping it with the Kafka round trips lifts the relay's
// rate. RelayOnce marks before it returns.
type eosShard struct {
	r        *eosRelay
	kc       kafkax.Config
	lease    *lease
	index    int    // shard index, 0..Shards-1
	shard    string // lease name: Shard, or Shard#index/Shards when there are several
	txnID    string // TransactionalID, or TransactionalID-<index>of<Shards>
	pendingQ string // reads the shard's oldest unpublished rows, pendingWhere + pendingOrder
	// pendingIDsQ is pendingQ reading the ids alone, before a linger. pendingIDsWhere is its
	// SELECT … WHERE.
	pendingIDsQ, pendingIDsWhere string
	// pendingWhere is pendingQ's SELECT … WHERE, which more conditions may follow.
	// pendingOrder is its ORDER BY clause from sqlText.pendingOrder, with " LIMIT ?".
	pendingWhere, pendingOrder string

	// wanted is whether this relay should own the shard. With one shard it always should.
	// With several, the membership of membership.go assigns them.
	wanted atomic.Bool

	mu           sync.Mutex // serialises relayOnce and close
	sess         *session
	standbyUntil time.Time
	topicReady   bool

	iso isolation // under mu
	rd  rowReader // under mu, reads pending rows
	// pendIDs and pendHashes are the pending ids and key hashes a read found. handed holds
	// the rows of a batch taken from the hand-off of handoff.go. All three are under mu.
	pendIDs, pendHashes []int64
	handed              []handedRow
	// idle is whether the last batch's read found nothing pending. The next batch then
	// looks for a pending row first, before it reads the parked keys. It is under mu.
	idle bool
	// foreignSeen is the session/seq of the last foreign batch position that a session start
	// logged at WARN, in reconcile.go. It is under mu.
	foreignSeen string

	owner      atomic.Bool
	fenced     atomic.Bool
	fencings   atomic.Int64
	reconciled atomic.Int64
	sessions   atomic.Int64
	takeovers  atomic.Int64 // leases taken, not renewed, for Relay.LeaseTakeovers
}

type session struct {
	p         sarama.SyncProducer
	client    sarama.Client // p's client, which the batch check asks about topics
	maxBytes  int           // p's Producer.MaxMessageBytes
	marking   *markJob      // the previous batch's mark, while it runs or until its error is seen
	id        string
	seq       int64
	partition int32 // the partition of the positions topic
}

func (e *eosShard) idleWait() time.Duration {
	if !e.owner.Load() {
		return e.standbyPoll()
	}
	return e.r.cfg.PollInterval
}

func (e *eosShard) standbyPoll() time.Duration {
	return min(max(e.r.cfg.LeaseTTL/4, e.r.cfg.PollInterval), time.Second)
}

func (e *eosShard) relayOnce(ctx context.Context, pipelined bool) (int, error) {
	if err := e.r.checkServer(ctx); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if time.Now().Before(e.standbyUntil) {
		return 0, nil
	}
	if !e.wanted.Load() {
		// The shard is not this relay's, or no longer. Hand it over at once if this relay
		// holds it. No transaction is open between batches, and endSession waits for the last
		// batch's mark.
		if e.lease.held {
			e.endSession("shard assigned to another relay")
			e.owner.Store(false)
			if err := e.lease.release(ctx); err != nil {
				return 0, err
			}
			e.r.logger.Info("outbox relay handed a shard over", watermill.LogFields{"shard": e.shard, "owner": e.r.cfg.Owner})
		}
		return 0, nil
	}
	if e.lease.due() {
		held, changed, err := e.lease.acquire(ctx)
		if err != nil && !e.lease.valid() {
			e.endSession("lease could not be renewed")
			e.owner.Store(false)
			return 0, err
		}
		if changed && held {
			e.takeovers.Add(1)
		}
		if changed {
			e.r.logger.Info("outbox relay lease "+map[bool]string{true: "acquired", false: "lost"}[held],
				watermill.LogFields{"shard": e.shard, "owner": e.r.cfg.Owner})
		}
		if !held {
			e.endSession("lease held by another instance")
			e.owner.Store(false)
			return 0, nil
		}
	}
	e.owner.Store(true)
	if e.sess == nil {
		if err := e.startSession(ctx); err != nil {
			e.endSession("session start failed")
			if errors.Is(err, ErrShardCountMismatch) || errors.Is(err, ErrPositionsReplication) {
				// Give the lease back. The relays of the other count see a live lease of ours
				// only while we hold it.
				e.owner.Store(false)
				err = errors.Join(err, e.lease.release(ctx))
			}
			return 0, e.failed(ctx, err)
		}
	}
	n, err := e.batch(ctx, pipelined)
	if errors.Is(err, errRefused) {
		e.endSession(err.Error())
		return 0, nil
	}
	if err != nil {
		e.endSession("batch failed")
		return 0, e.failed(ctx, err)
	}
	return n, nil
}

// failed classifies a session error. A fenced producer stops publishing for one lease TTL.
// It resumes only if it can take the lease again, which means that the instance that fenced
// it is gone.
func (e *eosShard) failed(ctx context.Context, err error) error {
	if !isFenced(err) {
		return err
	}
	e.fenced.Store(true)
	e.fencings.Add(1)
	e.lease.lose()
	e.owner.Store(false)
	e.standbyUntil = time.Now().Add(e.r.cfg.LeaseTTL)
	holder, live, herr := e.lease.holder(ctx)
	e.r.logger.Error("outbox relay FENCED: another producer took over the transactional.id; this relay stops publishing",
		err, watermill.LogFields{"transactional_id": e.txnID, "shard": e.shard, "owner": e.r.cfg.Owner,
			"lease_holder": holder, "lease_live": live, "lease_err": fmt.Sprint(herr), "standby_for": e.r.cfg.LeaseTTL.String()})
	return fmt.Errorf("%w: %w", ErrFenced, err)
}

func isFenced(err error) bool {
	fencedErrs := []error{sarama.ErrProducerFenced, sarama.ErrInvalidProducerEpoch, sarama.ErrTransactionalIDAuthorizationFailed}
	for _, f := range fencedErrs {
		if errors.Is(err, f) {
			return true
		}
	}
	var pes sarama.ProducerErrors
	if errors.As(err, &pes) {
		for _, pe := range pes {
			if isFenced(pe.Err) {
				return true
			}
		}
	}
	return false
}

func (e *eosShard) startSession(ctx context.Context) error {
	cfg := e.r.cfg
	if err := e.checkShardCount(ctx); err != nil {
		return err
	}
	if !e.topicReady {
		if err := e.ensurePositionsTopic(); err != nil {
			return err
		}
		e.topicReady = true
	}
	pc := e.producerConfig()
	client, err := sarama.NewClient(e.kc.Brokers, pc)
	if err != nil {
		return fmt.Errorf("transactional producer %s: %w", e.txnID, err)
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		_ = client.Close()
		return fmt.Errorf("transactional producer %s: %w", e.txnID, err)
	}
	s := &session{p: p, client: client, maxBytes: pc.Producer.MaxMessageBytes, id: randHex(8)}
	e.sess = s // endSession closes p from here on
	if h := e.r.handoff; h != nil {
		h.reset()
	}
	init := Position{V: 1, Kind: "init", TxnID: e.txnID, Shard: e.shard, Owner: cfg.Owner, Session: s.id, At: time.Now().UTC()}
	val, _ := json.Marshal(init)
	if err := p.BeginTxn(); err != nil {
		return fmt.Errorf("begin init transaction: %w", err)
	}
	part, off, err := p.SendMessage(&sarama.ProducerMessage{Topic: cfg.PositionsTopic, Key: sarama.StringEncoder(e.txnID + "/init"), Value: sarama.ByteEncoder(val)})
	if err != nil {
		return fmt.Errorf("write init position: %w", err)
	}
	if err := p.CommitTxn(); err != nil {
		return fmt.Errorf("commit init position: %w", err)
	}
	s.partition = part
	last, found, err := e.lastBatchPosition(ctx, part, off, s.id)
	if err != nil {
		return err
	}
	var marked int64
	if found && !faults.SkipReconcile() { // true only when the fault hooks of internal/faults skip it
		if marked, err = e.reconcile(ctx, last); err != nil {
			return err
		}
	}
	e.sessions.Add(1)
	e.fenced.Store(false)
	fields := watermill.LogFields{"session": s.id, "transactional_id": e.txnID, "shard": e.shard, "owner": cfg.Owner,
		"positions": fmt.Sprintf("%s/%d@%d", cfg.PositionsTopic, part, off)}
	if found {
		fields["last_batch"] = fmt.Sprintf("session %s seq %d (%d events)", last.Session, last.Seq, last.Events)
		fields["reconciled"] = marked
	}
	e.r.logger.Info("outbox relay session started", fields)
	if marked > 0 {
		e.r.logger.Info("outbox relay reconciled: rows already committed to Kafka were marked, not republished",
			watermill.LogFields{"rows": marked, "batch_session": last.Session, "batch_seq": last.Seq})
	}
	return nil
}

// endSession aborts an open transaction and closes the producer.
func (e *eosShard) endSession(why string) {
	s := e.sess
	if s == nil {
		return
	}
	e.sess = nil
	if m := s.marking; m != nil {
		// This is the mark of the last committed batch. Let it finish, within its own
		// timeout. Should it fail, the next relay session reconciles that batch.
		<-m.done
		if m.err != nil {
			e.r.logger.Error("outbox relay: marking a committed batch failed (the next relay session reconciles it)", m.err,
				watermill.LogFields{"session": s.id, "seq": m.seq})
		}
	}
	abortIfOpen(s.p)
	if err := s.p.Close(); err != nil {
		e.r.logger.Debug("outbox relay: close producer", watermill.LogFields{"err": err.Error()})
	}
	if err := s.client.Close(); err != nil && !errors.Is(err, sarama.ErrClosedClient) {
		e.r.logger.Debug("outbox relay: close client", watermill.LogFields{"err": err.Error()})
	}
	e.r.logger.Info("outbox relay session ended", watermill.LogFields{"session": s.id, "why": why})
}

func abortIfOpen(p sarama.SyncProducer) {
	if p.TxnStatus()&(sarama.ProducerTxnFlagInTransaction|sarama.ProducerTxnFlagAbortableError) != 0 &&
		p.TxnStatus()&sarama.ProducerTxnFlagFatalError == 0 {
		_ = p.AbortTxn()
	}
}

func (e *eosShard) close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.endSession("relay closed")
	e.owner.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return e.lease.release(ctx)
}

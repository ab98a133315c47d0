package outbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// DefaultPositionsTopic is the compacted topic where exactly-once relays record, in the
// same Kafka transaction as the events, which outbox ids each batch covered.
const DefaultPositionsTopic = "onceflow-relay-positions"

// ErrFenced is returned (wrapped) when another producer with the same transactional.id took
// over: this relay's session is over and it stops publishing.
var ErrFenced = errors.New("outbox relay fenced: another instance took over the transactional.id")

// errLeaseLost aborts a batch whose lease ran out before its Kafka commit.
var errLeaseLost = errors.New("outbox relay: lease expired before the Kafka commit; batch aborted")

// errRefused ends a session whose batch Kafka refused rows of (they are parked, or being
// isolated): the transaction is aborted and the next batch starts a new session at once.
var errRefused = errors.New("kafka refused events of the batch")

// Position is one record of the positions topic. Kind "batch" (key = transactional id) is
// written in the same Kafka transaction as the batch's events and lists the outbox ids the
// batch covered as inclusive ranges (ids are not contiguous). Kind "init" (key =
// transactional id + "/init") is written by every new session after its producer fenced
// the previous one; reading the topic up to it proves that every earlier committed batch
// has been seen.
type Position struct {
	V       int        `json:"v"`
	Kind    string     `json:"kind"`
	TxnID   string     `json:"txn_id"`
	Shard   string     `json:"shard"`
	Owner   string     `json:"owner"`
	Session string     `json:"session"`
	Seq     int64      `json:"seq,omitempty"`
	Events  int        `json:"events,omitempty"`
	IDs     [][2]int64 `json:"ids,omitempty"`
	// Digest is sha256 over the batch's event ids in id order. Reconcile marks rows only when
	// the table's rows with those ids carry exactly these events: a position left in Kafka by
	// another database (reset, restored, or sharing the transactional id) never marks rows
	// that were not published.
	Digest string    `json:"digest,omitempty"`
	At     time.Time `json:"at"`
}

// eventDigest is Position.Digest of event ids in id order.
func eventDigest(eventIDs []string) string {
	h := sha256.New()
	for _, id := range eventIDs {
		h.Write([]byte(id))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// exactlyOnce is the state of a relay in exactly-once mode.
//
// A session starts once this instance holds the shard's lease: a new transactional producer
// (InitProducerID with the shard's fixed transactional.id fences any earlier producer and
// aborts its open transaction, or completes one that was already committing), then an
// "init" position committed in its own transaction, then the topic is read (read_committed)
// up to that record to find the last committed batch position, whose rows are marked
// published if they are not yet (reconciliation). Only then does it publish.
//
// Each batch: a plain read of the oldest unpublished rows (no locks: only the lease owner
// publishes), one Kafka transaction with the events and the batch position, commit, then
// the rows are marked in a short database transaction. A batch is marked before the next
// one commits, so at most the last committed batch can be unmarked, and that is the one the
// next session reconciles. Any failure ends the session (abort, close the producer); the
// next session starts from the reconciliation again.
//
// Under Run the mark of batch N runs while batch N+1 is read and sent (pipelined): the read
// leaves out batch N's rows, and batch N+1's Kafka commit waits for batch N's mark, so the
// invariant above holds. The mark is the relay's largest cost (an indexed update per row);
// overlapping it with the Kafka round trips is what lifts the relay's rate. RelayOnce marks
// before it returns.
type exactlyOnce struct {
	r        *Relay
	kc       kafkax.Config
	lease    *lease
	index    int    // shard index, 0..Shards-1
	shard    string // lease name: Shard, or Shard#index/Shards when there are several
	txnID    string // TransactionalID, or TransactionalID-<index>of<Shards>
	pendingQ string // the shard's oldest unpublished rows: pendingWhere + pendingOrder
	// pendingWhere is pendingQ's SELECT … WHERE (more conditions may follow);
	// pendingOrder its " ORDER BY id LIMIT ?".
	pendingWhere, pendingOrder string

	// wanted is whether this relay should own the shard: always with one shard; with
	// several, as the membership assigns them (membership.go).
	wanted atomic.Bool

	mu           sync.Mutex // serialises relayOnce and close
	sess         *session
	standbyUntil time.Time
	topicReady   bool

	iso isolation // under mu

	owner      atomic.Bool
	fenced     atomic.Bool
	fencings   atomic.Int64
	reconciled atomic.Int64
	sessions   atomic.Int64
}

// markJob is a batch's database mark running in the background (pipelined batches).
type markJob struct {
	ids  []int64
	seq  int64
	done chan struct{}
	err  error
}

type session struct {
	p         sarama.SyncProducer
	client    sarama.Client // p's: the batch check asks it about topics
	maxBytes  int           // p's Producer.MaxMessageBytes
	marking   *markJob      // the previous batch's mark, while it runs or until its error is seen
	id        string
	seq       int64
	partition int32 // of the positions topic
}

// NewExactlyOnceRelay builds a relay in exactly-once mode. It creates its own transactional
// producer from kc (per session) and needs the relay_lease table (migration 00003) and a
// positions topic, which it creates (compacted, one partition) when missing. Call Run, or
// RelayOnce and then Close.
func NewExactlyOnceRelay(db *sql.DB, kc kafkax.Config, cfg RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	if db == nil {
		return nil, errors.New("relay: db is required")
	}
	kc.SetDefaults()
	r, err := newRelay(db, nil, cfg, logger)
	if err != nil {
		return nil, err
	}
	n := r.cfg.Shards
	for i := range n {
		e := &exactlyOnce{r: r, kc: kc, index: i, shard: r.cfg.Shard}
		if r.cfg.TransactionalID != "" { // else CheckServer derives it before the first session
			e.txnID = shardTxnID(r.cfg.TransactionalID, i, n)
		}
		e.pendingWhere = fmt.Sprintf(`SELECT id, event_id, event_type, topic, msg_key, payload, headers FROM %s
 WHERE published_at IS NULL`, r.cfg.Table)
		e.pendingOrder = " ORDER BY id LIMIT ?"
		if n > 1 {
			e.shard = ShardName(r.cfg.Shard, i, n)
			e.pendingWhere += fmt.Sprintf(" AND MOD(key_hash, %d) = %d", n, i)
		}
		e.pendingQ = e.pendingWhere + e.pendingOrder
		e.lease = newLease(db, e.shard, r.cfg.Owner, r.cfg.LeaseTTL)
		e.wanted.Store(n == 1)
		r.eos = append(r.eos, e)
	}
	if n > 1 {
		r.members = newMembership(r)
	}
	return r, nil
}

// ExactlyOnce reports whether the relay runs in exactly-once mode.
func (r *Relay) ExactlyOnce() bool { return len(r.eos) > 0 }

// Owner reports whether this relay holds the lease of at least one shard (always true in
// at-least-once mode, which has no lease).
func (r *Relay) Owner() bool { return len(r.eos) == 0 || len(r.OwnedShards()) > 0 }

// OwnedShards lists the indexes of the shards whose lease this relay holds.
func (r *Relay) OwnedShards() []int {
	var out []int
	for _, e := range r.eos {
		if e.owner.Load() {
			out = append(out, e.index)
		}
	}
	return out
}

// Fenced reports whether the last session of one of this relay's shards was fenced by
// another instance and has not published since.
func (r *Relay) Fenced() bool {
	for _, e := range r.eos {
		if e.fenced.Load() {
			return true
		}
	}
	return false
}

// Fencings is the number of times this relay was fenced.
func (r *Relay) Fencings() int64 {
	return r.sumShards(func(e *exactlyOnce) int64 { return e.fencings.Load() })
}

// Reconciled is the number of rows found already committed to Kafka at session start and
// marked published without being sent again.
func (r *Relay) Reconciled() int64 {
	return r.sumShards(func(e *exactlyOnce) int64 { return e.reconciled.Load() })
}

// Sessions is the number of exactly-once sessions this relay started (all shards).
func (r *Relay) Sessions() int64 {
	return r.sumShards(func(e *exactlyOnce) int64 { return e.sessions.Load() })
}

func (r *Relay) sumShards(f func(*exactlyOnce) int64) int64 {
	var n int64
	for _, e := range r.eos {
		n += f(e)
	}
	return n
}

// ShardName is the lease name of shard i of n in the shard group (RelayConfig.Shard):
// the group name itself when n is 1, else group#i/n.
func ShardName(group string, i, n int) string {
	if n == 1 {
		return group
	}
	return fmt.Sprintf("%s#%d/%d", group, i, n)
}

// shardTxnID is the transactional id of shard i of n of a group whose id is group: the
// group's own when n is 1, else group-<i>of<n>.
func shardTxnID(group string, i, n int) string {
	if n == 1 {
		return group
	}
	return fmt.Sprintf("%s-%dof%d", group, i, n)
}

// shardCountOf reports the shard count a lease name implies for group (0: another group).
func shardCountOf(group, name string) int {
	if name == group {
		return 1
	}
	rest, ok := strings.CutPrefix(name, group+"#")
	if !ok {
		return 0
	}
	_, count, ok := strings.Cut(rest, "/")
	n, err := strconv.Atoi(count)
	if !ok || err != nil || n < 1 {
		return 0
	}
	return n
}

func (e *exactlyOnce) idleWait() time.Duration {
	if !e.owner.Load() {
		return e.standbyPoll()
	}
	return e.r.cfg.PollInterval
}

func (e *exactlyOnce) standbyPoll() time.Duration {
	return min(max(e.r.cfg.LeaseTTL/4, e.r.cfg.PollInterval), time.Second)
}

func (e *exactlyOnce) relayOnce(ctx context.Context, pipelined bool) (int, error) {
	if err := e.r.CheckServer(ctx); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if time.Now().Before(e.standbyUntil) {
		return 0, nil
	}
	if !e.wanted.Load() {
		// Not (or no longer) this relay's shard: hand it over at once if it holds it. No
		// transaction is open between batches, and endSession waits for the last batch's mark.
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
			if errors.Is(err, ErrShardCountMismatch) {
				// Give the lease back: the relays of the other count keep seeing a live lease
				// of ours only while we hold it.
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

// failed classifies a session error: a fenced producer stops publishing for one lease TTL
// (it resumes only if it can take the lease again, i.e. the instance that fenced it is gone).
func (e *exactlyOnce) failed(ctx context.Context, err error) error {
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

// endSession aborts an open transaction and closes the producer.
func (e *exactlyOnce) endSession(why string) {
	s := e.sess
	if s == nil {
		return
	}
	e.sess = nil
	if m := s.marking; m != nil {
		// The mark of the last committed batch: let it finish (it is bounded by its own
		// timeout); should it fail, the next session reconciles that batch.
		<-m.done
		if m.err != nil {
			e.r.logger.Error("outbox relay: marking a committed batch failed (the next session reconciles it)", m.err,
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

func (e *exactlyOnce) close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.endSession("relay closed")
	e.owner.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return e.lease.release(ctx)
}

func (e *exactlyOnce) saramaConfig(base *sarama.Config) *sarama.Config {
	if e.r.cfg.Tune != nil {
		e.r.cfg.Tune(base)
	}
	return base
}

func (e *exactlyOnce) producerConfig() *sarama.Config {
	sc := e.kc.ProducerConfig()
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = e.txnID
	sc.Producer.Transaction.Timeout = e.r.cfg.TxnTimeout
	// Transactional requests (InitProducerID, AddPartitionsToTxn, EndTxn) are retried 20
	// times, 5ms doubling to 500ms (≈7s of waiting in all): long enough for InitProducerID
	// to wait out a predecessor's CONCURRENT_TRANSACTIONS, and the AddPartitionsToTxn that
	// follows a commit retries after 5ms instead of Sarama's 20ms (a one-record transaction
	// took ≈10ms instead of ≈26ms here). With the former fixed 100ms × 100 retries, each
	// retry also looking the coordinator up with 3 metadata retries, a stopped broker kept
	// one batch inside Sarama for about 3 minutes, silently (no failed batch, no log, the
	// lease expiring); measured now: ≈27s, later sessions fail in 0.25s, and the relay's
	// own backoff, log and metrics take over.
	sc.Producer.Transaction.Retry.Max = 20
	sc.Producer.Transaction.Retry.BackoffFunc = txnRetryBackoff
	sc.Metadata.Retry.Max = 1 // each transactional retry looks the coordinator up again
	// No cap on a request's messages: with ProducerConfig's flush wait a batch goes out as
	// one produce request (without it each of a batch's 2-4 requests was preceded by its own
	// AddPartitionsToTxn round trip: a 40-event batch took ≈26ms to send).
	sc.Producer.Flush.MaxMessages = 0
	positions, txnID := e.r.cfg.PositionsTopic, e.txnID
	sc.Producer.Partitioner = func(topic string) sarama.Partitioner {
		if topic == positions {
			return positionsPartitioner{hash: sarama.NewHashPartitioner(topic), key: txnID}
		}
		return sarama.NewHashPartitioner(topic)
	}
	return e.saramaConfig(sc)
}

func txnRetryBackoff(retries, _ int) time.Duration {
	return min(5*time.Millisecond<<min(retries, 7), 500*time.Millisecond)
}

// positionsPartitioner puts every position record of one transactional id (batch and init
// records have different keys) on one partition, so reading up to the init record sees all
// earlier batch records.
type positionsPartitioner struct {
	hash sarama.Partitioner
	key  string
}

func (p positionsPartitioner) Partition(_ *sarama.ProducerMessage, n int32) (int32, error) {
	return p.hash.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(p.key)}, n)
}
func (p positionsPartitioner) RequiresConsistency() bool { return true }

// ensurePositionsTopic creates the positions topic (compacted, one partition) if missing.
func (e *exactlyOnce) ensurePositionsTopic() error {
	sc := e.saramaConfig(e.kc.ConsumerConfig())
	admin, err := sarama.NewClusterAdmin(e.kc.Brokers, sc)
	if err != nil {
		return kafkax.Unreachable(e.kc.Brokers, err)
	}
	defer admin.Close()
	topic := e.r.cfg.PositionsTopic
	md, err := admin.DescribeTopics([]string{topic})
	if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError {
		return nil
	}
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return fmt.Errorf("describe kafka cluster: %w", err)
	}
	// Segments roll hourly (Kafka's default is 7 days) so compaction, which never touches
	// the active segment, keeps the topic near one record per key: a relay whose
	// transactional id has no batch yet reads the whole partition back at session start.
	policy, hour := "compact", "3600000"
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: int16(min(3, len(brokers))),
		ConfigEntries: map[string]*string{"cleanup.policy": &policy, "min.compaction.lag.ms": &hour, "segment.ms": &hour}}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create relay positions topic %s: %w", topic, err)
	}
	e.r.logger.Info("outbox relay: created positions topic", watermill.LogFields{"topic": topic})
	return nil
}

func (e *exactlyOnce) startSession(ctx context.Context) error {
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
	if found && !brokenSkipReconcile { // brokenSkipReconcile: false except in the chaos harness's broken build
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

// lastBatchPosition reads the positions partition (read_committed) backwards in growing
// windows up to this session's init record at offset initOff and returns the last batch
// record of this transactional id before it.
func (e *exactlyOnce) lastBatchPosition(ctx context.Context, part int32, initOff int64, sessionID string) (Position, bool, error) {
	cfg := e.r.cfg
	sc := e.saramaConfig(e.kc.ConsumerConfig())
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Return.Errors = true
	client, err := sarama.NewClient(e.kc.Brokers, sc)
	if err != nil {
		return Position{}, false, kafkax.Unreachable(e.kc.Brokers, err)
	}
	defer client.Close()
	oldest, err := client.GetOffset(cfg.PositionsTopic, part, sarama.OffsetOldest)
	if err != nil {
		return Position{}, false, fmt.Errorf("positions topic oldest offset: %w", err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return Position{}, false, err
	}
	defer consumer.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.TxnTimeout+30*time.Second)
	defer cancel()
	for window := int64(64); ; window *= 8 {
		start := max(oldest, initOff-window)
		pos, found, err := e.scanPositions(ctx, consumer, part, start, initOff, sessionID)
		if err != nil || found || start == oldest {
			return pos, found, err
		}
	}
}

func (e *exactlyOnce) scanPositions(ctx context.Context, consumer sarama.Consumer, part int32, start, initOff int64, sessionID string) (Position, bool, error) {
	cfg := e.r.cfg
	pc, err := consumer.ConsumePartition(cfg.PositionsTopic, part, start)
	if err != nil {
		return Position{}, false, fmt.Errorf("read positions %s/%d from %d: %w", cfg.PositionsTopic, part, start, err)
	}
	defer pc.Close()
	var (
		last  Position
		found bool
	)
	for {
		select {
		case m := <-pc.Messages():
			if m.Offset >= initOff {
				var p Position
				if m.Offset != initOff || json.Unmarshal(m.Value, &p) != nil || p.Session != sessionID {
					return Position{}, false, fmt.Errorf("positions %s/%d: offset %d is not this session's init record", cfg.PositionsTopic, part, m.Offset)
				}
				return last, found, nil
			}
			if string(m.Key) != e.txnID {
				continue
			}
			var p Position
			if err := json.Unmarshal(m.Value, &p); err != nil || p.Kind != "batch" {
				return Position{}, false, fmt.Errorf("positions %s/%d@%d: bad batch record: %v", cfg.PositionsTopic, part, m.Offset, err)
			}
			last, found = p, true
		case err := <-pc.Errors():
			return Position{}, false, fmt.Errorf("read positions: %w", err)
		case <-ctx.Done():
			return Position{}, false, fmt.Errorf("read positions up to offset %d: %w", initOff, ctx.Err())
		}
	}
}

// reconcile marks the rows of a batch that is committed in Kafka.
func (e *exactlyOnce) reconcile(ctx context.Context, p Position) (int64, error) {
	var total int64
	tx, err := e.r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	// Only a position that describes this table's rows may mark them (see Position.Digest).
	var eventIDs []string
	sel := fmt.Sprintf(`SELECT event_id FROM %s WHERE id BETWEEN ? AND ? ORDER BY id FOR UPDATE`, e.r.cfg.Table)
	for _, rg := range p.IDs {
		rows, err := tx.QueryContext(ctx, sel, rg[0], rg[1])
		if err != nil {
			return 0, fmt.Errorf("reconcile ids %d..%d: %w", rg[0], rg[1], err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, fmt.Errorf("reconcile: %w", err)
			}
			eventIDs = append(eventIDs, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("reconcile: %w", err)
		}
	}
	if p.Digest == "" || len(eventIDs) != p.Events || eventDigest(eventIDs) != p.Digest {
		e.r.logger.Error("outbox relay: the last committed batch in Kafka does not match this database's outbox rows; not reconciling (its rows, if any, are published again)",
			errPositionMismatch, watermill.LogFields{"transactional_id": p.TxnID, "session": p.Session, "seq": p.Seq,
				"events": p.Events, "rows_found": len(eventIDs)})
		return 0, nil
	}
	q := fmt.Sprintf(`UPDATE %s SET published_at = NOW(6) WHERE published_at IS NULL AND id BETWEEN ? AND ?`, e.r.cfg.Table)
	for _, rg := range p.IDs {
		res, err := tx.ExecContext(ctx, q, rg[0], rg[1])
		if err != nil {
			return 0, fmt.Errorf("reconcile ids %d..%d: %w", rg[0], rg[1], err)
		}
		n, _ := res.RowsAffected()
		total += n
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("reconcile commit: %w", err)
	}
	e.reconciled.Add(total)
	return total, nil
}

var errPositionMismatch = errors.New("position belongs to another database or an older state of this one")

// batch publishes the oldest unpublished rows in one Kafka transaction with their position,
// then marks them: before it returns, or, pipelined, in the background while the next batch
// is read and sent (see exactlyOnce).
//
// Before sending, rows Kafka would refuse (a topic missing from the metadata after a forced
// refresh, a record over the producer's max message bytes) and the rows of keys with parked
// events are parked (parked.go), and the batch is what remains: its position covers exactly
// the rows sent in its transaction. A send Kafka refuses rows of aborts the transaction
// (errRefused ends the session): the refused rows are parked, or, when the errors do not say
// which rows caused them, isolated over the next batches (isolation).
func (e *exactlyOnce) batch(ctx context.Context, pipelined bool) (int, error) {
	r, s, cfg := e.r, e.sess, e.r.cfg
	if m := s.marking; m != nil && isDone(m.done) {
		if err := e.collect(); err != nil {
			return 0, err
		}
	}
	// Parked keys before and after the pending read: see Relay.claim.
	before, err := r.parkedKeys(ctx, r.db)
	if err != nil {
		return 0, err
	}
	rows, err := e.pending(ctx)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	if again, err := r.linger(ctx, len(rows)); err != nil {
		return 0, err
	} else if again {
		if rows, err = e.pending(ctx); err != nil || len(rows) == 0 {
			return 0, err
		}
	}
	after, err := r.parkedKeys(ctx, r.db)
	if err != nil {
		return 0, err
	}
	sc, err := screen(rows, after, releasedKeys(before, after), &checker{md: s.client, maxBytes: s.maxBytes})
	if err != nil {
		return 0, err
	}
	if len(sc.park) > 0 {
		var moved []parkEntry
		if err := dbx.InTx(ctx, r.db, func(tx *sql.Tx) error {
			var err error
			moved, _, err = r.park(ctx, tx, sc.park)
			return err
		}); err != nil {
			return 0, err
		}
		r.logParked(moved, e.shard)
	}
	batch := e.iso.cut(sc.send)
	if len(batch) == 0 {
		return 0, nil
	}
	ids := make([]int64, len(batch))
	eventIDs := make([]string, len(batch))
	msgs := make([]*sarama.ProducerMessage, 0, len(batch)+1)
	for i, o := range batch {
		ids[i], eventIDs[i] = o.id, o.eventID
		msgs = append(msgs, o.msg)
	}
	s.seq++
	pos := Position{V: 1, Kind: "batch", TxnID: e.txnID, Shard: e.shard, Owner: cfg.Owner, Session: s.id,
		Seq: s.seq, Events: len(ids), IDs: idRanges(ids), Digest: eventDigest(eventIDs), At: time.Now().UTC()}
	val, err := json.Marshal(pos)
	if err != nil {
		return 0, err
	}
	posMsg := &sarama.ProducerMessage{Topic: cfg.PositionsTopic, Key: sarama.StringEncoder(e.txnID), Value: sarama.ByteEncoder(val)}
	msgs = append(msgs, posMsg)
	if err := s.p.BeginTxn(); err != nil {
		return 0, fmt.Errorf("begin kafka transaction: %w", err)
	}
	if err := s.p.SendMessages(msgs); err != nil {
		return 0, e.refusedSend(ctx, batch, posMsg, err)
	}
	e.iso.outcome(batch, nil)
	// The previous batch must be marked before this one commits: only the last committed
	// batch may be unmarked, as the next session reconciles only that one.
	if err := e.collect(); err != nil {
		return 0, err
	}
	r.hook("before-kafka-commit")
	if !e.lease.valid() {
		return 0, errLeaseLost
	}
	if err := s.p.CommitTxn(); err != nil {
		return 0, fmt.Errorf("commit kafka transaction (%d events): %w", len(ids), err)
	}
	r.hook("after-kafka-commit")
	// The batch is in Kafka. Mark it before anything else; if that fails the session ends and
	// the next one reconciles these rows from the position just committed.
	m := &markJob{ids: ids, seq: s.seq, done: make(chan struct{})}
	s.marking = m
	if !pipelined {
		e.markBatch(ctx, m)
		return len(ids), e.collect()
	}
	go e.markBatch(ctx, m)
	return len(ids), nil
}

// refusedSend handles a failed send of batch (its transaction is open and will be aborted):
// rows Kafka refused for good are parked, and errRefused is returned, unless no row was
// refused, when the error is returned as it is (the batch is retried).
func (e *exactlyOnce) refusedSend(ctx context.Context, batch []outRow, posMsg *sarama.ProducerMessage, err error) error {
	r := e.r
	res := sortSend(batch, posMsg, err)
	if len(res.unknown) > 0 {
		_ = e.sess.client.RefreshMetadata(res.unknown...) // the next batch's check sees the topic as it is now
	}
	if len(res.refused) == 0 {
		if res.firstFail != "" {
			return fmt.Errorf("publish %d events: %d failed, first %s: %w", len(batch), res.failed, res.firstFail, err)
		}
		return fmt.Errorf("publish %d events: %w", len(batch), err)
	}
	guilty := e.iso.outcome(batch, res.refused)
	if len(guilty) == 0 {
		r.logger.Error("outbox relay: Kafka refused events of a batch and did not say which; sending them in smaller batches to find out",
			err, watermill.LogFields{"shard": e.shard, "refused": len(res.refused), "suspects": len(e.iso.suspects), "first": res.firstFail})
		return fmt.Errorf("%w: isolating %d suspects", errRefused, len(e.iso.suspects))
	}
	entries := make([]parkEntry, 0, len(guilty))
	for _, i := range guilty {
		o := batch[i]
		entries = append(entries, parkEntry{row: o, reason: res.reasons[i], err: refusal{res.reasons[i], res.errs[i]}.text(o)})
	}
	// The transaction is never committed (it is aborted when the session ends), so these rows
	// are in no committed batch: parking them leaves every position's rows in the outbox.
	var moved []parkEntry
	if perr := dbx.InTx(ctx, r.db, func(tx *sql.Tx) error {
		var err error
		moved, _, err = r.park(ctx, tx, entries)
		return err
	}); perr != nil {
		return fmt.Errorf("publish %d events: kafka refused %s; parking it failed: %w", len(batch), batch[guilty[0]], perr)
	}
	r.logParked(moved, e.shard)
	return fmt.Errorf("%w: %d parked", errRefused, len(moved))
}

// markBatch marks a committed batch's rows, retrying a little, and closes m.done.
func (e *exactlyOnce) markBatch(ctx context.Context, m *markJob) {
	defer close(m.done)
	// A cancelled ctx (shutdown) must not skip the mark.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	e.r.hook("before-mark")
	for attempt := 0; attempt < 3; attempt++ {
		if m.err = e.mark(mctx, m.ids); m.err == nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	if m.err != nil {
		m.err = fmt.Errorf("batch %d is committed to Kafka, marking failed (reconciled by the next session): %w", m.seq, m.err)
		return
	}
	e.r.hook("after-mark")
	e.r.batches.Add(1)
	e.r.published.Add(int64(len(m.ids)))
}

// collect waits for the previous batch's mark and returns its error.
func (e *exactlyOnce) collect() error {
	s := e.sess
	m := s.marking
	if m == nil {
		return nil
	}
	<-m.done
	s.marking = nil
	return m.err // an error ends the session
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (e *exactlyOnce) pending(ctx context.Context) ([]outRow, error) {
	// Rows of a batch whose mark is still running are in Kafka already: read past them —
	// in the query when they form id ranges (the common case: not read twice), else by
	// reading that many more rows and dropping them here.
	var skip map[int64]bool
	query, args := e.pendingQ, []any{e.r.cfg.BatchSize}
	if m := e.sess.marking; m != nil {
		if cond, cargs, ranges := idMatch(m.ids); ranges {
			query, args = e.pendingWhere+" AND NOT "+cond+e.pendingOrder, append(cargs, e.r.cfg.BatchSize)
		} else {
			skip = make(map[int64]bool, len(m.ids))
			for _, id := range m.ids {
				skip[id] = true
			}
			args[0] = e.r.cfg.BatchSize + len(skip)
		}
	}
	rows, err := e.r.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("select pending outbox rows: %w", err)
	}
	defer rows.Close()
	var out []outRow
	for rows.Next() {
		var (
			o       outRow
			typ     string
			payload []byte
			headers sql.NullString
		)
		if err := rows.Scan(&o.id, &o.eventID, &typ, &o.topic, &o.key, &payload, &headers); err != nil {
			return nil, fmt.Errorf("scan outbox row: %w", err)
		}
		if skip[o.id] || len(out) == e.r.cfg.BatchSize {
			continue
		}
		if o.msg, err = buildMessage(o.id, o.eventID, typ, o.topic, o.key, payload, headers); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read outbox rows: %w", err)
	}
	return out, nil
}

func (e *exactlyOnce) mark(ctx context.Context, ids []int64) error {
	cond, args, _ := idMatch(ids)
	query := e.r.q.markPrefix + cond + " AND published_at IS NULL"
	if _, err := e.r.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("mark %d outbox rows published: %w", len(ids), err)
	}
	return nil
}

// idRanges compresses ascending ids into inclusive ranges.
func idRanges(ids []int64) [][2]int64 {
	var out [][2]int64
	for _, id := range ids {
		if n := len(out); n > 0 && out[n-1][1]+1 == id {
			out[n-1][1] = id
			continue
		}
		out = append(out, [2]int64{id, id})
	}
	return out
}

package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// ErrFenced is wrapped by the error a relay returns when another producer with the same
// transactional.id took over. This relay's session is then over, and it stops publishing.
var ErrFenced = errors.New("outbox relay fenced: another instance took over the transactional.id")

// errLeaseLost aborts a batch whose lease ran out before its Kafka commit.
var errLeaseLost = errors.New("outbox relay: lease expired before the Kafka commit; batch aborted")

// errRefused ends a session when Kafka refused rows of its batch. Those rows are parked or
// being isolated. The transaction is aborted, and the next batch starts a new session at
// once.
var errRefused = errors.New("kafka refused events of the batch")

// eosRelay is the engine of NewExactlyOnceRelay. It runs one eosShard per shard. eosshard.go
// holds the sessions, eosbatch.go the batches and reconcile.go the start of a session. With
// several shards, the membership of membership.go spreads them over the group's relays.
type eosRelay struct {
	*relayBase
	shards  []*eosShard
	members *membership // several shards only
	txnID   string      // the transactional id in use, set under checkMu before checked
	handoff *handoff    // the events this process's Writers hand over, nil when off
	db      *sql.DB
	release sync.Once // of handoff
}

var _ relayEngine = (*eosRelay)(nil)

// NewExactlyOnceRelay builds a relay in exactly-once mode. It creates its own transactional
// producer from kc for each session. It needs the relay_lease table of migration 00003 and
// a positions topic. It creates the topic when missing, compacted and with one partition.
// Call Run, or RelayOnce and then Close.
func NewExactlyOnceRelay(db *sql.DB, kc kafkax.Config, cfg RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	if db == nil {
		return nil, errors.New("relay: db is required")
	}
	kc = kc.WithDefaults()
	b, err := newRelayBase(db, cfg, logger)
	if err != nil {
		return nil, err
	}
	r := &eosRelay{relayBase: b, txnID: b.cfg.TransactionalID, db: db}
	n := r.cfg.Shards
	for i := range n {
		e := &eosShard{r: r, kc: kc, index: i, shard: r.cfg.Shard}
		if r.cfg.TransactionalID != "" { // else CheckServer derives it before the first relay session
			e.txnID = shardTxnID(r.cfg.TransactionalID, i, n)
		}
		e.pendingWhere = fmt.Sprintf(`SELECT id, event_id, event_type, topic, msg_key, payload, headers, trace_parent FROM %s
 WHERE published_at IS NULL`, r.cfg.Table)
		e.pendingIDsWhere = fmt.Sprintf(`SELECT id, key_hash FROM %s WHERE published_at IS NULL`, r.cfg.Table)
		e.pendingOrder = " " + b.dl.pendingOrder() + " LIMIT ?"
		if n > 1 {
			e.shard = ShardName(r.cfg.Shard, i, n)
			e.pendingWhere += fmt.Sprintf(" AND MOD(key_hash, %d) = %d", n, i)
			e.pendingIDsWhere += fmt.Sprintf(" AND MOD(key_hash, %d) = %d", n, i)
		}
		e.pendingQ = b.dl.Rebind(e.pendingWhere + e.pendingOrder)
		e.pendingIDsQ = b.dl.Rebind(e.pendingIDsWhere + e.pendingOrder)
		e.lease = newLease(db, e.shard, r.cfg.Owner, r.cfg.LeaseTTL)
		e.wanted.Store(n == 1)
		r.shards = append(r.shards, e)
	}
	if n > 1 {
		r.members = newMembership(r)
	}
	if b.cfg.HandOffBytes > 0 && b.dl.Returning() { // MySQL 8: no INSERT … RETURNING, nothing to hand over
		r.handoff = registerHandoff(db, b.cfg.Table, b.cfg.HandOffBytes, r)
	}
	return &Relay{relayBase: b, engine: r}, nil
}

// checkServer checks the pool's isolation and, without a TransactionalID, derives the
// default one from the pool's database.
func (r *eosRelay) checkServer(ctx context.Context) error {
	return r.relayBase.checkServer(ctx, r.deriveTransactionalID)
}

// deriveTransactionalID sets the default transactional id when none is configured. The
// default is "onceflow-relay-<database>-<shard>". See RelayConfig.TransactionalID.
func (r *eosRelay) deriveTransactionalID(ctx context.Context) error {
	if r.cfg.TransactionalID != "" {
		return nil
	}
	var name sql.NullString
	if err := r.db.QueryRowContext(ctx, r.dl.currentDatabase()).Scan(&name); err != nil {
		return fmt.Errorf("outbox relay: read the database name for the default transactional id: %w", err)
	}
	if !name.Valid || name.String == "" {
		return fmt.Errorf("%w: name one in its DSN, or set the relay's transactional id", ErrNoDatabase)
	}
	id := DefaultTransactionalID(name.String, r.cfg.Shard)
	if len(id) > 190 {
		return fmt.Errorf("relay: default transactional id %q longer than 190 bytes: set one", id)
	}
	r.setTransactionalID(id)
	return nil
}

// setTransactionalID sets the transactional id of the relay and of its shards. The caller
// holds checkMu and has not yet set checked. A shard reads its id only after CheckServer
// returned.
func (r *eosRelay) setTransactionalID(id string) {
	r.txnID = id
	for _, e := range r.shards {
		e.txnID = shardTxnID(id, e.index, len(r.shards))
	}
}

func (r *eosRelay) transactionalID() string {
	if !r.checked.Load() {
		r.checkMu.Lock()
		defer r.checkMu.Unlock()
	}
	return r.txnID
}

func (r *eosRelay) relayOnce(ctx context.Context) (int, error) {
	if err := r.checkServer(ctx); err != nil {
		return 0, err
	}
	if len(r.shards) == 1 {
		return r.shards[0].relayOnce(ctx, false)
	}
	return r.relayShardsOnce(ctx)
}

// relayShardsOnce renews the membership when due, then runs one batch of every shard.
// Standby shards publish nothing.
func (r *eosRelay) relayShardsOnce(ctx context.Context) (int, error) {
	if r.members.due() {
		if err := r.members.refresh(ctx); err != nil {
			return 0, err
		}
	}
	// The shards publish at once. Each has its own transactional producer, lease and
	// positions. A Kafka transaction spends most of its time waiting on the broker, so the
	// shards' transactions overlap instead of queueing.
	ns := make([]int, len(r.shards))
	errs := make([]error, len(r.shards))
	var wg sync.WaitGroup
	for i, e := range r.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := e.relayOnce(ctx, false)
			ns[i] = n
			if err != nil {
				errs[i] = fmt.Errorf("shard %s: %w", e.shard, err)
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, n := range ns {
		total += n
	}
	return total, errors.Join(errs...)
}

// run keeps the membership of several shards and runs every shard in its own goroutine,
// with its marks pipelined.
func (r *eosRelay) run(ctx context.Context) {
	var wg sync.WaitGroup
	if m := r.members; m != nil {
		if err := m.refresh(ctx); err != nil && ctx.Err() == nil {
			r.logger.Error("outbox relay membership refresh failed, will retry", err, watermill.LogFields{"group": r.cfg.Shard})
		}
		wg.Go(func() { m.run(ctx) })
	}
	for _, e := range r.shards {
		wg.Go(func() { r.loop(ctx, e.shard, shardBatches{e}) })
	}
	wg.Wait()
}

// shardBatches are the batches of one shard, with their marks pipelined. An idle shard
// waits its idleWait, the standby's poll when it does not own the shard. The owner of the
// first shard deletes expired published rows. Only an owner is woken.
type shardBatches struct{ e *eosShard }

func (b shardBatches) batch(ctx context.Context) (int, error) { return b.e.relayOnce(ctx, true) }
func (b shardBatches) idleWait() time.Duration                { return b.e.idleWait() }
func (b shardBatches) cleans() bool                           { return b.e.index == 0 && b.e.owner.Load() }
func (b shardBatches) wakeable() bool                         { return b.e.owner.Load() }

// idleMax keeps an idle owner's reads, which renew its lease, within a quarter of LeaseTTL.
func (b shardBatches) idleMax() time.Duration {
	return min(b.e.r.cfg.IdlePollMax, b.e.r.cfg.LeaseTTL/4)
}

func (r *eosRelay) close() error {
	var errs []error
	if r.members != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errs = append(errs, r.members.leave(ctx))
	}
	for _, e := range r.shards {
		errs = append(errs, e.close())
	}
	if r.handoff != nil {
		r.release.Do(func() { unregisterHandoff(r.db, r.cfg.Table, r.handoff, r) })
	}
	return errors.Join(errs...)
}

// checkWith does nothing. Each session checks its batches with its own producer's client.
func (r *eosRelay) checkWith(Metadata, int) {}

func (r *eosRelay) exactlyOnce() bool { return true }

func (r *eosRelay) owner() bool { return len(r.ownedShards()) > 0 }

func (r *eosRelay) ownedShards() []int {
	var out []int
	for _, e := range r.shards {
		if e.owner.Load() {
			out = append(out, e.index)
		}
	}
	return out
}

func (r *eosRelay) fenced() bool {
	for _, e := range r.shards {
		if e.fenced.Load() {
			return true
		}
	}
	return false
}

func (r *eosRelay) stats() eosStats {
	var s eosStats
	for _, e := range r.shards {
		s.fencings += e.fencings.Load()
		s.reconciled += e.reconciled.Load()
		s.sessions += e.sessions.Load()
		s.takeovers += e.takeovers.Load()
	}
	return s
}

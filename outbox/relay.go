package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// RelayConfig configures a Relay. Its defaults are the router's (configs/router.yaml,
// README's configuration table), so a relay wired by hand behaves as the stock binary's.
type RelayConfig struct {
	Table string // default "outbox"
	// BatchSize is the most rows per Kafka batch (a Kafka transaction in exactly-once mode);
	// default 2000 (README's configuration table, relay.batch_size: 1,000 → 10.8k, 2,000 →
	// 13.6k exactly-once events/s; larger batches republish more after an abort).
	BatchSize    int
	PollInterval time.Duration // sleep when nothing is pending; default 50ms
	RetryBackoff time.Duration // after a failed publish, doubling up to MaxRetryBackoff; default 1s
	LagBound     time.Duration // an unpublished row older than this is a violation (verify); default 1m

	// Linger is how long a partial batch waits for more rows before it is published (as
	// Kafka's linger.ms): when a read finds fewer than BatchSize pending rows, the relay waits
	// Linger once, reads again from the oldest pending row and publishes what it finds then
	// (at most BatchSize). Under a steady trickle this makes fewer, bigger Kafka transactions
	// (and database marks) for at most Linger of added latency; a full batch never waits.
	// Default 5ms (as Kafka's linger.ms since Kafka 4.0); NoLinger (any negative value)
	// publishes at once. No lock is held while lingering.
	Linger time.Duration

	// MaxRetryBackoff caps the doubling retry backoff; default 5s (never below RetryBackoff).
	MaxRetryBackoff time.Duration

	// Retention deletes published rows older than this, CleanupBatch rows per DELETE, every
	// CleanupInterval (defaults 1m and 500). 0 keeps published rows forever.
	Retention       time.Duration
	CleanupInterval time.Duration
	CleanupBatch    int

	// Exactly-once mode only (NewExactlyOnceRelay); see ExactlyOnce in eos.go.
	Shard string // shard group (the one shard when Shards is 1); default "default"
	// TransactionalID is the Kafka transactional.id of the shard group, the same on every
	// relay of the group. Default "onceflow-relay-<database>-<shard>": <database> is the
	// pool's database, read with SELECT DATABASE() before the first batch (CheckServer), and
	// <shard> is Shard — the router's default too. So relays of two databases sharing a Kafka
	// cluster (a demo and production, say) never fence each other and never read each
	// other's positions, and a database restored on another server, or a replica promoted,
	// keeps its id (no server identity is part of it). Two servers that hold databases of the
	// same name and share a Kafka cluster must set it (or different Shards). TransactionalID
	// reports the id in use.
	TransactionalID string

	// Shards splits the outbox into this many shards (default 1): a row belongs to shard
	// MOD(key_hash, Shards), key_hash being CRC32 of its key (migration 00005), so a key's
	// events stay in one shard and in order. Each shard has its own lease (Shard#i/n), its
	// own transactional id (TransactionalID-<i>of<n>) and positions; the relays of a group
	// spread the shards among themselves (relay_member) and take over a dead one's. All
	// relays of a group must use the same count: change it only with a drained outbox and
	// every relay of the old count stopped (relays that disagree refuse to publish).
	Shards int

	PositionsTopic string        // compacted topic of relay positions; default "onceflow-relay-positions"
	Owner          string        // lease owner name; default host-pid-random
	LeaseTTL       time.Duration // lease lifetime, renewed every LeaseTTL/4; default 10s
	TxnTimeout     time.Duration // Kafka transaction timeout; default 30s

	// Tune, when set, adjusts the Sarama config of the transactional producer and of the
	// position reader (tests use it to inject a failing dialer).
	Tune func(*sarama.Config)

	// Hook, when set, is called at named points of a batch ("linger" just before a partial
	// batch waits, "before-kafka-commit", "after-kafka-commit", "before-mark", "after-mark";
	// in exactly-once mode under Run the last two are called from the goroutine that marks
	// the batch in the background). Crash tests use it to exit the process there.
	Hook func(point string)
}

// NoLinger as RelayConfig.Linger publishes a partial batch at once (any negative value
// does; the zero value stands for the default).
const NoLinger time.Duration = -1

// setDefaults fills the zero settings with their defaults.
func (c *RelayConfig) setDefaults() {
	if c.Table == "" {
		c.Table = "outbox"
	}
	if c.BatchSize == 0 {
		c.BatchSize = 2000
	}
	if c.Linger == 0 {
		c.Linger = 5 * time.Millisecond
	}
	if c.PollInterval == 0 {
		c.PollInterval = 50 * time.Millisecond
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = time.Second
	}
	if c.LagBound == 0 {
		c.LagBound = time.Minute
	}
	if c.MaxRetryBackoff == 0 {
		c.MaxRetryBackoff = 5 * time.Second
	}
	c.MaxRetryBackoff = max(c.MaxRetryBackoff, c.RetryBackoff)
	if c.CleanupInterval == 0 {
		c.CleanupInterval = time.Minute
	}
	if c.CleanupBatch == 0 {
		c.CleanupBatch = 500
	}
	if c.Shard == "" {
		c.Shard = "default"
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.PositionsTopic == "" {
		c.PositionsTopic = DefaultPositionsTopic
	}
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.TxnTimeout == 0 {
		c.TxnTimeout = 30 * time.Second
	}
}

// WithDefaults returns c with every zero setting replaced by its default, as NewRelay and
// NewExactlyOnceRelay use it; WithDefaults().Validate() checks a config before a relay is
// built from it.
func (c RelayConfig) WithDefaults() RelayConfig {
	c.setDefaults()
	return c
}

// Validate reports the first invalid setting. It only checks: a zero setting that stands
// for a default is invalid here until the default is filled in (WithDefaults).
func (c RelayConfig) Validate() error {
	if err := dbx.CheckIdent("outbox table", c.Table); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if err := dbx.CheckIdent("parked outbox table", parkedTable(c.Table)); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		return fmt.Errorf("relay: batch size %d outside 1..10000", c.BatchSize)
	}
	if c.PollInterval <= 0 || c.RetryBackoff <= 0 {
		return errors.New("relay: poll interval and retry backoff must be positive")
	}
	if c.Linger > 10*time.Second || c.Linger >= c.LeaseTTL/2 {
		return fmt.Errorf("relay: linger %s must be at most 10s and below half the lease ttl (%s)", c.Linger, c.LeaseTTL)
	}
	if c.Retention < 0 || c.CleanupInterval <= 0 || c.CleanupBatch < 1 || c.CleanupBatch > 100000 {
		return fmt.Errorf("relay: retention %s must not be negative, cleanup interval %s positive, cleanup batch %d within 1..100000",
			c.Retention, c.CleanupInterval, c.CleanupBatch)
	}
	if len(c.Shard) > 52 || len(c.Owner) > 191 || len(c.TransactionalID) > 190 {
		return errors.New("relay: shard (52), owner (191) or transactional id (190) too long")
	}
	if c.Shards < 1 || c.Shards > 256 {
		return fmt.Errorf("relay: shards %d outside 1..256", c.Shards)
	}
	if strings.ContainsAny(c.Shard, "#/") {
		return fmt.Errorf("relay: shard %q: '#' and '/' are reserved for shard names", c.Shard)
	}
	if err := kafkax.CheckTopicName(c.PositionsTopic); err != nil {
		return fmt.Errorf("relay: positions topic: %w", err)
	}
	if c.LeaseTTL < 100*time.Millisecond {
		return fmt.Errorf("relay: lease ttl %s: at least 100ms", c.LeaseTTL)
	}
	if c.TxnTimeout < time.Second {
		return fmt.Errorf("relay: transaction timeout %s: at least 1s", c.TxnTimeout)
	}
	return nil
}

// Producer is the part of a Sarama sync producer the relay uses.
type Producer interface {
	SendMessages(msgs []*sarama.ProducerMessage) error
}

// Relay forwards outbox rows to Kafka.
//
// Gap safety: the relay does not track a high-water id. It selects rows whose published_at
// is NULL, so a row whose auto-increment id was allocated early but committed late is
// simply picked up by the next poll; nothing is skipped and no SERIALIZABLE transaction or
// range lock is needed. Rows are claimed with FOR UPDATE SKIP LOCKED (row locks only, at
// READ COMMITTED), so business inserts never wait for the relay and two relays never
// publish the same row at the same time.
//
// Order per key: a locking scan is not a snapshot. Scanning pending rows directly with
// SKIP LOCKED skips a row whose transaction is still committing and then picks up rows of
// transactions that committed a moment later, so a key's later event could overtake an
// earlier one. The relay therefore first reads the pending ids with a plain (consistent)
// read, which sees only committed rows, then locks exactly those rows with SKIP LOCKED. A
// candidate it cannot lock (another relay holds it) holds back every later candidate of the
// same key until the next poll.
//
// Delivery (this at-least-once mode, NewRelay): the producer is idempotent (acks=all), so
// broker retries add no duplicates. A relay that crashes after Kafka accepted a batch but
// before the rows were marked publishes that batch again on restart: at least once, with
// the same event_id header. NewExactlyOnceRelay builds the exactly-once relay (eos.go):
// transactional producer, batch positions in the same Kafka transaction, a lease per shard.
type Relay struct {
	db       *sql.DB
	producer Producer
	cfg      RelayConfig
	logger   watermill.LoggerAdapter
	q        relayQueries
	eos      []*exactlyOnce // one per shard; nil in at-least-once mode
	members  *membership    // several shards only

	md       Metadata // CheckWith (at-least-once mode)
	maxBytes int

	isoMu sync.Mutex
	iso   isolation // at-least-once mode; each shard has its own in exactly-once mode

	checkMu sync.Mutex  // serialises CheckServer
	checked atomic.Bool // CheckServer succeeded
	txnID   string      // the transactional id in use (exactly-once mode); set before checked

	published atomic.Int64
	parked    atomic.Int64
	batches   atomic.Int64
	lingers   atomic.Int64
	failures  atomic.Int64
	deleted   atomic.Int64
	wakes     atomic.Int64

	wakeMu sync.Mutex
	wakeCh chan struct{} // closed by Wake; replaced once a loop has seen it closed
	woken  bool
}

// Wake tells an idle relay that rows were just committed, so it reads them now instead of
// after its poll interval (the router calls it after every delivery that committed work).
// It never blocks; many calls between two reads cost one read.
func (r *Relay) Wake() {
	r.wakeMu.Lock()
	if !r.woken {
		if r.wakeCh == nil {
			r.wakeCh = make(chan struct{})
		}
		close(r.wakeCh)
		r.woken = true
	}
	r.wakeMu.Unlock()
}

// Wakes returns how many idle waits Wake cut short.
func (r *Relay) Wakes() int64 { return r.wakes.Load() }

// wakeC returns the channel the next Wake closes.
func (r *Relay) wakeC() <-chan struct{} {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	if r.wakeCh == nil || r.woken {
		r.wakeCh, r.woken = make(chan struct{}), false
	}
	return r.wakeCh
}

type relayQueries struct {
	pending, claimPrefix, claimSuffix string
	oldestPending, markPrefix         string
	cleanup                           string
	parkedKeys                        string
}

// NewRelay builds a Relay.
//
// This is the at-least-once relay (see the Relay comment); NewExactlyOnceRelay builds the
// exactly-once one.
func NewRelay(db *sql.DB, producer Producer, cfg RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	if db == nil || producer == nil {
		return nil, errors.New("relay: db and producer are required")
	}
	if cfg.Shards > 1 {
		return nil, errors.New("relay: several shards need the exactly-once relay (relay.exactly_once)")
	}
	return newRelay(db, producer, cfg, logger)
}

func newRelay(db *sql.DB, producer Producer, cfg RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	t := cfg.Table
	return &Relay{db: db, producer: producer, cfg: cfg, logger: logger, txnID: cfg.TransactionalID, q: relayQueries{
		pending: fmt.Sprintf(`SELECT id, msg_key FROM %s WHERE published_at IS NULL ORDER BY id LIMIT %d`, t, cfg.BatchSize),
		claimPrefix: fmt.Sprintf(`SELECT id, event_id, event_type, topic, msg_key, payload, headers FROM %s
 WHERE published_at IS NULL AND id IN (`, t),
		claimSuffix:   `) ORDER BY id FOR UPDATE SKIP LOCKED`,
		oldestPending: fmt.Sprintf(`SELECT MIN(created_at) FROM %s WHERE published_at IS NULL`, t),
		markPrefix:    fmt.Sprintf(`UPDATE %s SET published_at = NOW(6) WHERE `, t),
		cleanup:       fmt.Sprintf(`DELETE FROM %s WHERE published_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT %d`, t, cfg.CleanupBatch),
		parkedKeys:    fmt.Sprintf(`SELECT msg_key, COALESCE(held_behind, event_id) FROM %s ORDER BY id`, parkedTable(t)),
	}}, nil
}

// Published is the number of events this relay has published.
func (r *Relay) Published() int64 { return r.published.Load() }

// Batches is the number of batches this relay has published: Kafka transactions in
// exactly-once mode, SendMessages calls in at-least-once mode.
func (r *Relay) Batches() int64 { return r.batches.Load() }

// Parked is the number of rows this relay has moved to the parked table: events Kafka
// refuses for good and the later events of their keys (held behind them).
func (r *Relay) Parked() int64 { return r.parked.Load() }

// Lingers is the number of times a partial batch waited Linger for more rows.
func (r *Relay) Lingers() int64 { return r.lingers.Load() }

// Failures is the number of failed (and retried) batches.
func (r *Relay) Failures() int64 { return r.failures.Load() }

// Deleted is the number of published rows the retention cleanup has deleted.
func (r *Relay) Deleted() int64 { return r.deleted.Load() }

// ErrNoDatabase is returned by CheckServer when the relay's pool has no default database
// (its DSN names none) and the exactly-once relay has no TransactionalID to use instead.
var ErrNoDatabase = errors.New("relay: the pool has no default database")

// CheckServer checks, once, that the database can run this relay, and completes the
// configuration it depends on; RelayOnce and Run call it before the first batch (call it
// at start-up to report a misconfiguration before anything runs). The pool's sessions must
// run at READ COMMITTED (dbx.CheckIsolation): a pool that does not is refused with an error
// wrapping dbx.ErrIsolation. In exactly-once mode without a TransactionalID, the default
// one is derived from the pool's database: "onceflow-relay-<database>-<shard>"
// (RelayConfig.TransactionalID). A failed check is made again on the next call.
func (r *Relay) CheckServer(ctx context.Context) error {
	if r.checked.Load() {
		return nil
	}
	r.checkMu.Lock()
	defer r.checkMu.Unlock()
	if r.checked.Load() {
		return nil
	}
	if err := dbx.CheckIsolation(ctx, r.db); err != nil {
		return fmt.Errorf("outbox relay: %w", err)
	}
	if len(r.eos) > 0 && r.cfg.TransactionalID == "" {
		var name sql.NullString
		if err := r.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
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
	}
	r.checked.Store(true)
	return nil
}

// DefaultTransactionalID is the transactional id of an exactly-once relay of shard group
// shard on database (RelayConfig.TransactionalID).
func DefaultTransactionalID(database, shard string) string {
	return "onceflow-relay-" + database + "-" + shard
}

// setTransactionalID sets the transactional id of the relay and of its shards (under
// checkMu, before checked is set: a shard reads its id only after CheckServer returned).
func (r *Relay) setTransactionalID(id string) {
	r.txnID = id
	for _, e := range r.eos {
		e.txnID = shardTxnID(id, e.index, len(r.eos))
	}
}

// TransactionalID returns the Kafka transactional.id of the relay's shard group (each
// shard's is TransactionalID-<i>of<n> when there are several): the configured one, or the
// default derived by CheckServer ("" until then); "" in at-least-once mode.
func (r *Relay) TransactionalID() string {
	if len(r.eos) == 0 {
		return ""
	}
	if !r.checked.Load() {
		r.checkMu.Lock()
		defer r.checkMu.Unlock()
	}
	return r.txnID
}

// permanentCheckError reports a CheckServer error that no retry fixes.
func permanentCheckError(err error) bool {
	return errors.Is(err, dbx.ErrIsolation) || errors.Is(err, ErrNoDatabase)
}

// Run relays until ctx is cancelled. Publish failures are logged and retried with a doubling
// backoff (RetryBackoff up to MaxRetryBackoff); nothing is dropped. Events Kafka refuses for
// good are parked instead of retried, with the later events of their keys (parked.go). With
// a Retention, published rows older than it are deleted every CleanupInterval. In exactly-once mode Run also takes and
// renews the shard's lease, waits as a standby while another instance holds it, and on return
// aborts any open Kafka transaction, closes its producer and releases the lease. With several
// shards each one it owns runs in its own goroutine, and the relay keeps its membership.
//
// Run first calls CheckServer and returns its error if the pool cannot run a relay (not at
// READ COMMITTED, no database for the default transactional id); a database it cannot
// reach yet is retried like a failed batch.
func (r *Relay) Run(ctx context.Context) error {
	defer r.Close()
	if err := r.CheckServer(ctx); err != nil && permanentCheckError(err) {
		return err
	}
	if len(r.eos) == 0 {
		r.loop(ctx, "", r.RelayOnce, func() time.Duration { return r.cfg.PollInterval }, func() bool { return true }, func() bool { return true })
		return nil
	}
	var wg sync.WaitGroup
	if m := r.members; m != nil {
		if err := m.refresh(ctx); err != nil && ctx.Err() == nil {
			r.logger.Error("outbox relay membership refresh failed, will retry", err, watermill.LogFields{"group": r.cfg.Shard})
		}
		wg.Go(func() { m.run(ctx) })
	}
	for _, e := range r.eos {
		// The owner of the first shard deletes expired published rows.
		wg.Go(func() {
			once := func(ctx context.Context) (int, error) { return e.relayOnce(ctx, true) }
			r.loop(ctx, e.shard, once, e.idleWait, func() bool { return e.index == 0 && e.owner.Load() }, e.owner.Load)
		})
	}
	wg.Wait()
	return nil
}

// loop calls once until ctx ends, backing off after failures and sleeping idle() when
// there was nothing to publish; cleans reports whether this loop runs the retention cleanup.
//
// An idle wait ends early on Wake when wakeable reports true (the loop publishes: not a
// standby, not backing off after a failure).
func (r *Relay) loop(ctx context.Context, shard string, once func(context.Context) (int, error), idle func() time.Duration, cleans, wakeable func() bool) {
	backoff := r.cfg.RetryBackoff
	var nextCleanup time.Time
	for {
		woke := r.wakeC() // taken before the read: a Wake during it cuts the next wait short
		n, err := once(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := time.Duration(0)
		switch {
		case err != nil:
			r.failures.Add(1)
			fields := watermill.LogFields{"backoff": backoff.String()}
			if shard != "" {
				fields["shard"] = shard
			}
			r.logger.Error("outbox relay batch failed, will retry", err, fields)
			wait = backoff
			backoff = min(2*backoff, r.cfg.MaxRetryBackoff)
		case n == 0:
			backoff = r.cfg.RetryBackoff
			wait = idle()
		default:
			backoff = r.cfg.RetryBackoff
		}
		if r.cfg.Retention > 0 && time.Now().After(nextCleanup) && cleans() {
			if _, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.logger.Error("outbox cleanup failed, will retry", err, nil)
			}
			nextCleanup = time.Now().Add(r.cfg.CleanupInterval)
		}
		if wait > 0 {
			var wake <-chan struct{}
			if err == nil && wakeable() {
				wake = woke
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-wake:
				// Rows committed since the read: read again now. A partial batch lingers in
				// the read itself, so a burst of wakes (one per delivery) still costs one
				// batch, and a woken row waits one Linger, not two (it used to wait here too).
				t.Stop()
				r.wakes.Add(1)
			}
		}
	}
}

// Close releases what the relay holds: in exactly-once mode the open Kafka transaction is
// aborted, the producer closed and the lease released so a standby takes over at once. Run
// calls it on return; callers that only use RelayOnce call it themselves. It is safe to call
// more than once, and the relay can be used again afterwards (it starts a new session).
func (r *Relay) Close() error {
	var errs []error
	if r.members != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errs = append(errs, r.members.leave(ctx))
	}
	for _, e := range r.eos {
		errs = append(errs, e.close())
	}
	return errors.Join(errs...)
}

// Cleanup deletes published rows older than the retention, CleanupBatch rows per statement,
// and returns how many it deleted. It never touches unpublished rows.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	if r.cfg.Retention <= 0 {
		return 0, nil
	}
	var total int64
	for {
		res, err := r.db.ExecContext(ctx, r.q.cleanup, r.cfg.Retention.Microseconds())
		if err != nil {
			return total, fmt.Errorf("delete published outbox rows: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, err
		}
		total += n
		r.deleted.Add(n)
		if n < int64(r.cfg.CleanupBatch) {
			return total, nil
		}
	}
}

func (r *Relay) hook(point string) {
	if r.cfg.Hook != nil {
		r.cfg.Hook(point)
	}
}

// linger reports whether a read that found n pending rows should wait for more; if so it
// waits Linger (returning ctx's error if ctx ends first) and the caller reads again from
// the start, so rows that committed out of id order meanwhile take their place in id order.
func (r *Relay) linger(ctx context.Context, n int) (bool, error) {
	if r.cfg.Linger <= 0 || n == 0 || n >= r.cfg.BatchSize {
		return false, nil
	}
	r.lingers.Add(1)
	r.hook("linger")
	t := time.NewTimer(r.cfg.Linger)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-t.C:
		return true, nil
	}
}

// RelayOnce publishes one batch of pending rows and marks them before it returns (Run
// pipelines the marks in exactly-once mode). It returns how many rows it published.
//
// Rows Kafka refuses for good are parked (parked.go, refusal.go) instead of being retried:
// checked before the batch is sent where that is possible (CheckWith), else when the
// producer reports the refusal. In this at-least-once mode what Kafka acked is marked
// published and what it refused is parked; an acked row of a key whose earlier row was
// refused in the same batch is held behind that row and published again after it.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	if err := r.CheckServer(ctx); err != nil {
		return 0, err
	}
	switch {
	case len(r.eos) == 1:
		return r.eos[0].relayOnce(ctx, false)
	case len(r.eos) > 1:
		return r.relayShardsOnce(ctx)
	}
	var (
		n       int
		sendErr error
		parked  []parkEntry
	)
	err := dbx.InTx(ctx, r.db, func(tx *sql.Tx) error {
		n, sendErr, parked = 0, nil, nil
		send, moved, err := r.claim(ctx, tx)
		parked = moved
		if err != nil || len(send) == 0 {
			return err
		}
		r.isoMu.Lock()
		batch := r.iso.cut(send)
		r.isoMu.Unlock()
		msgs := make([]*sarama.ProducerMessage, len(batch))
		for i, o := range batch {
			msgs[i] = o.msg
		}
		if err := r.producer.SendMessages(msgs); err != nil {
			var moved []parkEntry
			n, moved, sendErr, err = r.sentInPart(ctx, tx, batch, err)
			parked = append(parked, moved...)
			return err
		}
		r.hook("after-kafka-commit") // Kafka has acked; the rows are not marked yet
		ids := make([]int64, len(batch))
		for i, o := range batch {
			ids[i] = o.id
		}
		if err := r.mark(ctx, tx, ids); err != nil {
			return err
		}
		r.isoMu.Lock()
		r.iso.outcome(batch, nil)
		r.isoMu.Unlock()
		n = len(ids)
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.logParked(parked, "")
	if n > 0 {
		r.batches.Add(1)
	}
	r.published.Add(int64(n))
	return n, sendErr
}

// sentInPart settles a batch whose send failed for some rows (at-least-once mode, in the
// claim's transaction): the acked rows are marked, the rows Kafka refused for good are parked
// (with the later rows of their keys, held, acked or not), and the rest stay pending — with
// the later rows of their keys, acked or not, so that those go out again after them.
// It returns how many rows it marked and, when rows failed otherwise, the batch's error.
func (r *Relay) sentInPart(ctx context.Context, tx *sql.Tx, batch []outRow, err error) (marked int, parked []parkEntry, batchErr, txErr error) {
	res := sortSend(batch, nil, err)
	if len(res.unknown) > 0 && r.md != nil {
		_ = r.md.RefreshMetadata(res.unknown...) // the next batch's check sees the topic as it is now
	}
	r.isoMu.Lock()
	guilty := r.iso.outcome(batch, res.refused)
	suspects := len(r.iso.suspects)
	r.isoMu.Unlock()
	isGuilty := make(map[int]bool, len(guilty))
	for _, i := range guilty {
		isGuilty[i] = true
	}
	var (
		entries []parkEntry
		acked   []int64
		heads   map[string]string
		failed  map[string]bool // keys with a row that failed and stays pending
	)
	for i, o := range batch {
		if isGuilty[i] {
			entries = append(entries, parkEntry{row: o, reason: res.reasons[i], err: refusal{res.reasons[i], res.errs[i]}.text(o)})
			if heads == nil {
				heads = map[string]string{}
			}
			if _, ok := heads[o.key]; !ok {
				heads[o.key] = o.eventID
			}
			continue
		}
		if head, ok := heads[o.key]; ok {
			entries = append(entries, parkEntry{row: o, reason: ReasonHeld, behind: head})
			continue
		}
		if _, ok := res.errs[i]; ok || failed[o.key] {
			// Failed (retried), or acked after a row of its key that failed: left pending
			// too, so it goes out again after that row (at least once, in key order).
			if failed == nil {
				failed = map[string]bool{}
			}
			failed[o.key] = true
			continue
		}
		acked = append(acked, o.id)
	}
	moved, _, perr := r.park(ctx, tx, entries)
	if perr != nil {
		return 0, nil, nil, perr
	}
	if len(acked) > 0 {
		if err := r.mark(ctx, tx, acked); err != nil {
			return 0, nil, nil, err
		}
	}
	if len(res.refused) > len(guilty) {
		r.logger.Error("outbox relay: Kafka refused events of a batch and did not say which; sending them in smaller batches to find out",
			err, watermill.LogFields{"refused": len(res.refused), "suspects": suspects, "first": res.firstFail})
	}
	if res.failed > 0 {
		return len(acked), moved, fmt.Errorf("publish %d events: %d failed (retried), first %s", len(batch), res.failed, res.firstFail), nil
	}
	return len(acked), moved, nil, nil
}

// logParked logs what park moved and counts it.
func (r *Relay) logParked(moved []parkEntry, shard string) {
	type heldKey struct{ behind, key string }
	var (
		held  map[heldKey]int
		order []heldKey
	)
	for _, e := range moved {
		r.parked.Add(1)
		if e.reason == ReasonHeld {
			k := heldKey{e.behind, e.row.key}
			if held == nil {
				held = map[heldKey]int{}
			}
			if held[k] == 0 {
				order = append(order, k)
			}
			held[k]++
			continue
		}
		fields := watermill.LogFields{"event_id": e.row.eventID, "topic": e.row.topic, "key": e.row.key,
			"outbox_id": e.row.id, "reason": e.reason}
		if shard != "" {
			fields["shard"] = shard
		}
		r.logger.Error("outbox event PARKED: Kafka refuses it for good; later events of its key wait behind it (router outbox ls, retry, drop)",
			errors.New(e.err), fields)
	}
	for _, k := range order {
		fields := watermill.LogFields{"behind": k.behind, "key": k.key, "events": held[k]}
		if shard != "" {
			fields["shard"] = shard
		}
		r.logger.Info("outbox events held behind a parked event of their key", fields)
	}
}

// relayShardsOnce renews the membership when due, then runs one batch of every shard
// (standby shards publish nothing).
func (r *Relay) relayShardsOnce(ctx context.Context) (int, error) {
	if r.members.due() {
		if err := r.members.refresh(ctx); err != nil {
			return 0, err
		}
	}
	// The shards publish at once: each has its own transactional producer, lease and
	// positions, and a Kafka transaction spends most of its time waiting on the broker, so
	// the shards' transactions overlap instead of queueing.
	ns := make([]int, len(r.eos))
	errs := make([]error, len(r.eos))
	var wg sync.WaitGroup
	for i, e := range r.eos {
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

// claim returns the next batch in id order. See the Relay comment for why the pending ids
// are read first and locked second.
//
// Parked keys: the keys with parked events are read before and after the pending ids. A key
// parked after the pending read is seen by the second read, and its rows are held behind its
// parked event (moved to the parked table in this transaction) — a park committed between the
// reads is never missed. A key parked before and not after was retried or dropped meanwhile;
// the pending read may have missed the events put back, so its rows wait for the next batch.
// Rows Kafka would refuse (CheckWith) are parked here too, before anything is sent.
func (r *Relay) claim(ctx context.Context, tx *sql.Tx) (send []outRow, parked []parkEntry, err error) {
	type candidate struct {
		id  int64
		key string
	}
	before, err := r.parkedKeys(ctx, tx)
	if err != nil {
		return nil, nil, err
	}
	var cands []candidate
	read := func() error {
		cands = cands[:0]
		rows, err := tx.QueryContext(ctx, r.q.pending)
		if err != nil {
			return fmt.Errorf("select pending outbox rows: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var c candidate
			if err := rows.Scan(&c.id, &c.key); err != nil {
				return fmt.Errorf("scan pending outbox row: %w", err)
			}
			cands = append(cands, c)
		}
		return rows.Err()
	}
	err = read()
	if err != nil || len(cands) == 0 {
		return nil, nil, err
	}
	// The candidates come from a plain read: the transaction holds no lock while it lingers.
	if again, err := r.linger(ctx, len(cands)); err != nil {
		return nil, nil, err
	} else if again {
		if err := read(); err != nil {
			return nil, nil, err
		}
	}
	after, err := r.parkedKeys(ctx, tx)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]int64, len(cands))
	for i, c := range cands {
		ids[i] = c.id
	}
	query, args := inList(r.q.claimPrefix, ids, r.q.claimSuffix)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("lock pending outbox rows: %w", err)
	}
	defer rows.Close()
	locked := make(map[int64]outRow, len(cands))
	for rows.Next() {
		var (
			o       outRow
			typ     string
			payload []byte
			headers sql.NullString
		)
		if err := rows.Scan(&o.id, &o.eventID, &typ, &o.topic, &o.key, &payload, &headers); err != nil {
			return nil, nil, fmt.Errorf("scan outbox row: %w", err)
		}
		if o.msg, err = buildMessage(o.id, o.eventID, typ, o.topic, o.key, payload, headers); err != nil {
			return nil, nil, err
		}
		locked[o.id] = o
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read outbox rows: %w", err)
	}
	rows.Close()
	batch := make([]outRow, len(cands))
	for i, c := range cands {
		o, ok := locked[c.id]
		if !ok {
			// Another relay holds it: it holds back every later candidate of its key (screen).
			o = outRow{id: c.id, key: c.key}
		}
		batch[i] = o
	}
	s, err := screen(batch, after, releasedKeys(before, after), &checker{md: r.md, maxBytes: r.maxBytes})
	if err != nil {
		return nil, nil, err
	}
	moved, _, err := r.park(ctx, tx, s.park)
	if err != nil {
		return nil, nil, err
	}
	return s.send, moved, nil
}

// buildMessage turns an outbox row into a Kafka message: key = aggregate id, headers
// event_id and event_type first, then the row's extra headers.
func buildMessage(id int64, eventID, typ, topic, key string, payload []byte, headers sql.NullString) (*sarama.ProducerMessage, error) {
	m := &sarama.ProducerMessage{
		Topic: topic,
		Key:   sarama.StringEncoder(key),
		Value: sarama.ByteEncoder(payload),
		Headers: []sarama.RecordHeader{
			{Key: []byte(HeaderEventID), Value: []byte(eventID)},
			{Key: []byte(HeaderEventType), Value: []byte(typ)},
		},
	}
	if headers.Valid && headers.String != "" {
		var extra map[string]string
		if err := json.Unmarshal([]byte(headers.String), &extra); err != nil {
			return nil, fmt.Errorf("outbox row %d headers: %w", id, err)
		}
		for k, v := range extra {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
		}
	}
	return m, nil
}

func (r *Relay) mark(ctx context.Context, tx *sql.Tx, ids []int64) error {
	cond, args, _ := idMatch(ids)
	query := r.q.markPrefix + cond
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("mark %d outbox rows published: %w", len(ids), err)
	}
	return nil
}

// idMatch returns a condition on id matching exactly ids, and its arguments. A batch's ids
// are mostly consecutive, so it lists their ranges — one range scan each — unless there
// are more than half as many ranges as ids (a shard's rows interleave with other shards'):
// then an IN list. (Marking 2,000 consecutive rows through an IN list cost MariaDB ≈12–16 µs
// of CPU per row, one index dive per id; through BETWEEN ≈6–8.) ranges reports which.
func idMatch(ids []int64) (cond string, args []any, ranges bool) {
	rs := idRanges(ids)
	if len(rs)*2 > len(ids) {
		cond, args = inList("id IN (", ids, ")")
		return cond, args, false
	}
	var b strings.Builder
	args = make([]any, 0, 2*len(rs))
	b.WriteByte('(')
	for i, r := range rs {
		if i > 0 {
			b.WriteString(" OR ")
		}
		if r[0] == r[1] {
			b.WriteString("id = ?")
			args = append(args, r[0])
			continue
		}
		b.WriteString("id BETWEEN ? AND ?")
		args = append(args, r[0], r[1])
	}
	b.WriteByte(')')
	return b.String(), args, true
}

// inList returns prefix + "?,?,...?" + suffix and the ids as arguments.
func inList(prefix string, ids []int64, suffix string) (string, []any) {
	var b strings.Builder
	b.WriteString(prefix)
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('?')
		args[i] = id
	}
	b.WriteString(suffix)
	return b.String(), args
}

// OldestPendingAge returns the age of the oldest unpublished row (0 when none).
func (r *Relay) OldestPendingAge(ctx context.Context) (time.Duration, error) {
	var t sql.NullTime
	if err := r.db.QueryRowContext(ctx, r.q.oldestPending).Scan(&t); err != nil {
		return 0, fmt.Errorf("oldest pending outbox row: %w", err)
	}
	if !t.Valid {
		return 0, nil
	}
	return max(time.Since(t.Time), 0), nil
}

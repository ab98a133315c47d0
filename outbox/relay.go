package outbox

import (
	"context"
	"errors"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Relay forwards outbox rows to Kafka: NewRelay builds one that publishes at least once
// (atLeastOnce, atleastonce.go), NewExactlyOnceRelay one whose events read_committed
// consumers see exactly once (eosRelay, eos.go). The mode is the engine a Relay holds; what
// both share (configuration, counters, wake-ups, the idle and backoff loop, retention
// cleanup, parking) is relayBase (base.go).
//
// Gap safety: the relay does not track a high-water id. It selects rows whose published_at
// is NULL, so a row whose id (auto-increment, or PostgreSQL identity) was allocated early
// but committed late is simply picked up by the next poll; nothing is skipped and no
// SERIALIZABLE transaction or range lock is needed. A batch is marked by its exact id
// ranges, so such a row inside a batch's id span is not marked with it.
type Relay struct {
	*relayBase
	engine relayEngine
}

// relayEngine is one way of publishing the outbox: at least once (atLeastOnce) or exactly
// once (eosRelay). Relay's methods whose answer depends on the mode ask it.
type relayEngine interface {
	checkServer(ctx context.Context) error      // CheckServer
	relayOnce(ctx context.Context) (int, error) // RelayOnce: one batch (of every shard), marked before it returns
	run(ctx context.Context)                    // Run, after its first CheckServer
	close() error                               // Close
	checkWith(md Metadata, maxMessageBytes int) // CheckWith
	exactlyOnce() bool
	transactionalID() string
	owner() bool
	ownedShards() []int
	fenced() bool
	stats() eosStats
}

// eosStats are the counters of the exactly-once sessions (all zero at least once).
type eosStats struct{ fencings, reconciled, sessions, takeovers int64 }

// Producer is the part of a Sarama sync producer the relay uses.
type Producer interface {
	SendMessages(msgs []*sarama.ProducerMessage) error
}

// RelayOnce publishes one batch of pending rows and marks them before it returns (Run
// pipelines the marks in exactly-once mode). It returns how many rows it published.
//
// Rows Kafka refuses for good are parked (parked.go, refusal.go) instead of being retried:
// checked before the batch is sent where that is possible (CheckWith), else when the
// producer reports the refusal. In this at-least-once mode what Kafka acked is marked
// published and what it refused is parked; an acked row of a key whose earlier row was
// refused in the same batch is held behind that row and published again after it.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) { return r.engine.relayOnce(ctx) }

// Run relays until ctx is cancelled. Publish failures are logged and retried with a doubling
// backoff (RetryBackoff up to MaxRetryBackoff); nothing is dropped. Events Kafka refuses for
// good are parked instead of retried, with the later events of their keys (parked.go). With
// a Retention, published rows older than it are deleted every CleanupInterval. In
// exactly-once mode Run also takes and renews the shard's lease, waits as a standby while
// another instance holds it, and on return aborts any open Kafka transaction, closes its
// producer and releases the lease. With several shards each one it owns runs in its own
// goroutine, and the relay keeps its membership.
//
// Run first calls CheckServer and returns its error if the pool cannot run a relay (not at
// READ COMMITTED, no database for the default transactional id); a database it cannot
// reach yet is retried like a failed batch.
func (r *Relay) Run(ctx context.Context) error {
	defer r.Close()
	if err := r.CheckServer(ctx); err != nil && permanentCheckError(err) {
		return err
	}
	r.engine.run(ctx)
	return nil
}

// permanentCheckError reports a CheckServer error that no retry fixes.
func permanentCheckError(err error) bool {
	return errors.Is(err, dbx.ErrIsolation) || errors.Is(err, ErrNoDatabase)
}

// Close releases what the relay holds: in exactly-once mode the open Kafka transaction is
// aborted, the producer closed and the lease released so a standby takes over at once. Run
// calls it on return; callers that only use RelayOnce call it themselves. It is safe to call
// more than once, and the relay can be used again afterwards (it starts a new session).
func (r *Relay) Close() error { return r.engine.close() }

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
func (r *Relay) CheckServer(ctx context.Context) error { return r.engine.checkServer(ctx) }

// DefaultTransactionalID is the transactional id of an exactly-once relay of shard group
// shard on database (RelayConfig.TransactionalID).
func DefaultTransactionalID(database, shard string) string {
	return "onceflow-relay-" + database + "-" + shard
}

// TransactionalID returns the Kafka transactional.id of the relay's shard group (each
// shard's is TransactionalID-<i>of<n> when there are several): the configured one, or the
// default derived by CheckServer ("" until then); "" in at-least-once mode.
func (r *Relay) TransactionalID() string { return r.engine.transactionalID() }

// CheckWith makes the at-least-once relay check every batch before sending it: rows for a
// topic md does not know (after a forced metadata refresh) and rows larger than
// maxMessageBytes (the producer's Producer.MaxMessageBytes; 0: not checked) are parked, not
// sent. Without it such rows are parked only when Kafka refuses them, and a missing topic is
// retried. The exactly-once relay checks with its own producer's client. Call it before Run.
func (r *Relay) CheckWith(md Metadata, maxMessageBytes int) *Relay {
	r.engine.checkWith(md, maxMessageBytes)
	return r
}

// ExactlyOnce reports whether the relay runs in exactly-once mode.
func (r *Relay) ExactlyOnce() bool { return r.engine.exactlyOnce() }

// Owner reports whether this relay holds the lease of at least one shard (always true in
// at-least-once mode, which has no lease).
func (r *Relay) Owner() bool { return r.engine.owner() }

// OwnedShards lists the indexes of the shards whose lease this relay holds.
func (r *Relay) OwnedShards() []int { return r.engine.ownedShards() }

// Fenced reports whether the last relay session of one of this relay's shards was fenced by
// another instance and has not published since.
func (r *Relay) Fenced() bool { return r.engine.fenced() }

// Fencings is the number of times this relay was fenced.
func (r *Relay) Fencings() int64 { return r.engine.stats().fencings }

// Reconciled is the number of rows found already committed to Kafka at session start and
// marked published without being sent again.
func (r *Relay) Reconciled() int64 { return r.engine.stats().reconciled }

// Sessions is the number of exactly-once sessions this relay started (all shards).
func (r *Relay) Sessions() int64 { return r.engine.stats().sessions }

// LeaseTakeovers is the number of times this relay took a shard's lease it did not hold:
// at start, from an instance whose lease expired or was released, or back after losing it.
// Renewals do not count. Always 0 in at-least-once mode (no lease).
func (r *Relay) LeaseTakeovers() int64 { return r.engine.stats().takeovers }

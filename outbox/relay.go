package outbox

import (
	"context"
	"errors"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Relay forwards outbox rows to Kafka. NewRelay builds one that publishes at least once,
// with the atLeastOnce engine of atleastonce.go. NewExactlyOnceRelay builds one whose events
// read_committed consumers see exactly once, with the eosRelay engine of eos.go. The
// engine a Relay holds is its mode. relayBase, in base.go, holds what both engines share.
//
// The relay does not track a high-water id, so gaps in the ids are safe. It selects rows
// whose published_at is NULL. A row may get its id early and commit late. The id comes from
// auto-increment, or from an identity column on PostgreSQL. The next poll picks such a row
// up. Nothing is skipped, and no SERIALIZABLE transaction or range lock is needed. A batch
// is marked by its exact id ranges, so such a row inside a batch's id span is not marked
// with it.
type Relay struct {
	*relayBase
	engine relayEngine
}

// relayEngine is one way of publishing the outbox. atLeastOnce publishes at least once and
// eosRelay exactly once. Relay's methods whose answer depends on the mode ask the engine.
type relayEngine interface {
	checkServer(ctx context.Context) error      // CheckServer
	relayOnce(ctx context.Context) (int, error) // RelayOnce, one batch of every shard, marked before it returns
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

// eosStats are the counters of the exactly-once sessions. They stay zero at least once.
type eosStats struct{ fencings, reconciled, sessions, takeovers int64 }

// Producer is the part of a Sarama sync producer the relay uses.
type Producer interface {
	SendMessages(msgs []*sarama.ProducerMessage) error
}

// RelayOnce publishes one batch of pending rows and marks them before it returns. Run
// pipelines the marks in exactly-once mode instead. RelayOnce returns how many rows it
// published.
//
// Rows Kafka refuses for good are parked instead of retried. The relay checks them before
// the batch is sent where it can, as CheckWith describes. Otherwise it parks them when the
// producer reports the refusal. In at-least-once mode, what Kafka acked is marked published
// and what it refused is parked. An acked row may follow a refused row of the same key in
// the same batch. It is then held behind that row and published again after it.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) { return r.engine.relayOnce(ctx) }

// Run relays until ctx is cancelled. Publish failures are logged and retried with a backoff
// that doubles from RetryBackoff up to MaxRetryBackoff. Nothing is dropped. Events Kafka
// refuses for good are parked instead of retried, with the later events of their keys. With
// a Retention, published rows older than it are deleted every CleanupInterval.
//
// In exactly-once mode Run also takes and renews the shard's lease. It waits as a standby
// while another instance holds the lease. On return it aborts any open Kafka transaction,
// closes its producer and releases the lease. With several shards, each shard it owns runs
// in its own goroutine, and the relay keeps its membership.
//
// Run first calls CheckServer. It returns CheckServer's error if the pool cannot run a
// relay, because the pool is not at READ COMMITTED or has no database for the default
// transactional id. A database it cannot reach yet is retried like a failed batch.
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

// Close releases what the relay holds. In exactly-once mode it aborts the open Kafka
// transaction, closes the producer and releases the lease, so a standby takes over at once.
// Run calls Close on return. Callers that only use RelayOnce call it themselves. It is safe
// to call more than once. The relay can be used again afterwards and starts a new session.
func (r *Relay) Close() error {
	r.parkLog.flush(r.logger, true)
	return r.engine.close()
}

// ErrNoDatabase is returned by CheckServer when the relay's pool has no default database,
// because its DSN names none, and the exactly-once relay has no TransactionalID to use
// instead.
var ErrNoDatabase = errors.New("relay: the pool has no default database")

// CheckServer checks once that the database can run this relay. It also completes the
// configuration that depends on the database. RelayOnce and Run call it before the first
// batch. Call it at start-up to report a misconfiguration before anything runs.
//
// The pool's sessions must run at READ COMMITTED, as dbx.CheckIsolation checks. A pool that
// does not is refused with an error wrapping dbx.ErrIsolation. In exactly-once mode without
// a TransactionalID, CheckServer derives the default one from the pool's database. It is
// "onceflow-relay-<database>-<shard>", as RelayConfig.TransactionalID describes. A failed
// check is made again on the next call.
func (r *Relay) CheckServer(ctx context.Context) error { return r.engine.checkServer(ctx) }

// DefaultTransactionalID is the transactional id of an exactly-once relay of shard group
// shard on database. See RelayConfig.TransactionalID.
func DefaultTransactionalID(database, shard string) string {
	return "onceflow-relay-" + database + "-" + shard
}

// TransactionalID returns the Kafka transactional.id of the relay's shard group. It is the
// configured one, or the default that CheckServer derives. It is empty until then, and
// always empty in at-least-once mode. With several shards, each shard's id is
// TransactionalID-<i>of<n>.
func (r *Relay) TransactionalID() string { return r.engine.transactionalID() }

// CheckWith makes the at-least-once relay check every batch before sending it. The relay
// then parks rows for a topic that md does not know after a forced metadata refresh. It
// also parks rows larger than maxMessageBytes, the producer's Producer.MaxMessageBytes. A
// maxMessageBytes of 0 checks no sizes. Without CheckWith, such rows are parked only when
// Kafka refuses them, and a missing topic is retried. The exactly-once relay checks with its
// own producer's client. Call CheckWith before Run.
func (r *Relay) CheckWith(md Metadata, maxMessageBytes int) *Relay {
	r.engine.checkWith(md, maxMessageBytes)
	return r
}

// ExactlyOnce reports whether the relay runs in exactly-once mode.
func (r *Relay) ExactlyOnce() bool { return r.engine.exactlyOnce() }

// Owner reports whether this relay holds the lease of at least one shard. It is always
// true in at-least-once mode, which has no lease.
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

// Sessions is the number of exactly-once sessions this relay started, over all shards.
func (r *Relay) Sessions() int64 { return r.engine.stats().sessions }

// LeaseTakeovers is the number of times this relay took a shard's lease it did not hold.
// It takes a lease at start, from an instance whose lease expired or was released, or back
// after losing it. Renewals do not count. It is always 0 in at-least-once mode, which has no
// lease.
func (r *Relay) LeaseTakeovers() int64 { return r.engine.stats().takeovers }

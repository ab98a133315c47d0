package outbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// RelayConfig configures a Relay. Its defaults are the router's (configs/router.yaml,
// README's configuration table), so a relay wired by hand behaves as the stock binary's.
type RelayConfig struct {
	Table string // default "outbox"
	// BatchSize is the most rows per Kafka batch (a Kafka transaction in exactly-once mode);
	// default 2000 (docs/BENCHMARKS.md, "Why the defaults: relay.batch_size 2000"; larger
	// batches republish more after an abort).
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
	// CleanupInterval (defaults 168h, 1m and 500). KeepPublished (any negative value) keeps
	// published rows forever; the zero value stands for the default.
	Retention       time.Duration
	CleanupInterval time.Duration
	CleanupBatch    int

	// Exactly-once mode only (NewExactlyOnceRelay); see eosShard (eosshard.go).
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

	PositionsTopic string // compacted topic of relay positions; default "onceflow-relay-positions"
	// PositionsMinReplicas is the least replication factor the positions topic must have on
	// a cluster of at least that many brokers (on a smaller one: as many as it has). An
	// exactly-once relay checks it at each start: it creates a missing topic with
	// replication factor min(3, brokers) — and min.insync.replicas=2 when that is 3 or more
	// — and refuses (ErrPositionsReplication) an existing one below it. Default 3; 1 accepts
	// any topic.
	PositionsMinReplicas int
	Owner                string        // lease owner name; default host-pid-random
	LeaseTTL             time.Duration // lease lifetime, renewed every LeaseTTL/4; default 10s
	TxnTimeout           time.Duration // Kafka transaction timeout; default 30s

	// Tune, when set, adjusts the Sarama config of the transactional producer and of the
	// position reader (tests use it to inject a failing dialer).
	Tune func(*sarama.Config)

	// TracerProvider, when set, traces the relay: one span ("send <topic>", a producer span)
	// per published event whose row has a trace parent (trace_parent: its writer was
	// traced), a child of that stored context, from the batch's send to its Kafka commit
	// (exactly once) or ack (at least once); the record's traceparent header then carries
	// the send span's context. Nil (the default): no span, and the header carries the stored
	// trace parent as it is, so traces still cross the relay.
	TracerProvider trace.TracerProvider

	// Hook, when set, is called at named points of a batch ("linger" just before a partial
	// batch waits, "before-kafka-commit", "after-kafka-commit", "before-mark", "after-mark";
	// in exactly-once mode under Run the last two are called from the goroutine that marks
	// the batch in the background). Crash tests use it to exit the process there.
	Hook func(point string)
}

// KeepPublished as RelayConfig.Retention keeps published rows forever (any negative value
// does; the zero value stands for the default).
const KeepPublished time.Duration = -1

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
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
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
	if c.PositionsMinReplicas == 0 {
		c.PositionsMinReplicas = 3
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
	if c.CleanupInterval <= 0 || c.CleanupBatch < 1 || c.CleanupBatch > 100000 {
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
	if c.PositionsMinReplicas < 1 || c.PositionsMinReplicas > 16 {
		return fmt.Errorf("relay: positions min replicas %d outside 1..16", c.PositionsMinReplicas)
	}
	if c.LeaseTTL < 100*time.Millisecond {
		return fmt.Errorf("relay: lease ttl %s: at least 100ms", c.LeaseTTL)
	}
	if c.TxnTimeout < time.Second {
		return fmt.Errorf("relay: transaction timeout %s: at least 1s", c.TxnTimeout)
	}
	return nil
}

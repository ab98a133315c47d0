package outbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// RelayConfig configures a Relay. The tags declare the stock router's relay.* settings
// (internal/settings): key, default, range and help; so a relay wired by hand behaves as the
// stock binary's.
type RelayConfig struct {
	Table string // default "outbox"
	// BatchSize is the most rows per Kafka batch (a Kafka transaction in exactly-once mode);
	// larger batches republish more after an abort (docs/BENCHMARKS.md, "Why the defaults:
	// relay.batch_size 2000").
	BatchSize    int           `key:"batch_size" default:"2000" range:"1..10000" help:"events per Kafka transaction (larger: fewer commits, more republished after an abort; docs/BENCHMARKS.md, Why the defaults)"`
	PollInterval time.Duration `key:"poll_interval" default:"50ms" range:"1ms..1m" help:"relay sleep when nothing is pending"` // sleep when nothing is pending

	// Linger is how long a partial batch waits for more rows before it is published (as
	// Kafka's linger.ms): when a read finds fewer than BatchSize pending rows, the relay waits
	// Linger once, reads again from the oldest pending row and publishes what it finds then
	// (at most BatchSize). Under a steady trickle this makes fewer, bigger Kafka transactions
	// (and database marks) for at most Linger of added latency; a full batch never waits.
	// At most 10s, and below half LeaseTTL; NoLinger (any negative value) publishes at once.
	// No lock is held while lingering.
	Linger time.Duration `key:"linger" default:"5ms" range:"0..10s" zero:"-1ns" help:"a partial batch waits this long once for more rows before it is published (as Kafka's linger.ms); 0 publishes at once"`

	// HandOffBytes bounds the events a Writer of this process hands to this exactly-once
	// relay from the inbox's group-committed batches (a Writer whose UseStatements pool is
	// the relay's, the same table; MariaDB and PostgreSQL): the relay still reads which
	// rows are pending, in id order, from the database (an index-only read), and takes their
	// contents from the hand-off instead of reading them back (handoff.go). A full hand-off
	// takes no more until the relay drains it. NoHandOff (any negative value) turns it off;
	// the zero value stands for the default.
	HandOffBytes int `key:"handoff_bytes" default:"4194304" range:"0..1073741824" zero:"-1" help:"bytes of committed events the router's batches hand to its exactly-once relay in memory, so it does not read them back (0 turns it off)"`

	LagBound time.Duration `key:"lag_bound" default:"1m" range:"1s..168h" help:"verify: unpublished rows older than this are a violation"` // an unpublished row older than this is a violation (verify)

	// Exactly-once mode only (NewExactlyOnceRelay); see eosShard (eosshard.go).
	Shard string `key:"shard" default:"default" help:"shard group of the outbox (one lease and one transactional.id per shard)"` // shard group (the one shard when Shards is 1)

	// Shards splits the outbox into this many shards: a row belongs to shard
	// MOD(key_hash, Shards), key_hash being CRC32 of its key (migration 00005; hashtext on
	// PostgreSQL), so a key's events stay in one shard and in order. Each shard has its own
	// lease (Shard#i/n), its own transactional id (TransactionalID-<i>of<n>) and positions;
	// the relays of a group spread the shards among themselves (relay_member) and take over
	// a dead one's. All relays of a group must use the same count: change it only with a
	// drained outbox and every relay of the old count stopped (relays that disagree refuse
	// to publish).
	Shards int `key:"shards" default:"1" range:"1..256" help:"outbox shards (hash of the key mod shards): the group's relays spread them; change only with a drained outbox"`

	// TransactionalID is the Kafka transactional.id of the shard group, the same on every
	// relay of the group. Default "onceflow-relay-<database>-<shard>": <database> is the
	// pool's database, read with SELECT DATABASE() before the first batch (CheckServer), and
	// <shard> is Shard — the router's default too. So relays of two databases sharing a Kafka
	// cluster (a demo and production, say) never fence each other and never read each
	// other's positions, and a database restored on another server, or a replica promoted,
	// keeps its id (no server identity is part of it). Two servers that hold databases of the
	// same name and share a Kafka cluster must set it (or different Shards). TransactionalID
	// reports the id in use.
	TransactionalID string `key:"transactional_id" help:"Kafka transactional.id (default onceflow-relay-<database>-<shard>, so two databases never share positions or fence each other); the same on every instance of the shard"`

	PositionsTopic string `key:"positions_topic" default:"onceflow-relay-positions" help:"compacted topic of batch positions (created if missing)"` // compacted topic of relay positions (DefaultPositionsTopic)
	// PositionsMinReplicas is the least replication factor the positions topic must have on
	// a cluster of at least that many brokers (on a smaller one: as many as it has). An
	// exactly-once relay checks it at each start: it creates a missing topic with
	// replication factor min(3, brokers) — and min.insync.replicas=2 when that is 3 or more
	// — and refuses (ErrPositionsReplication) an existing one below it. 1 accepts any topic.
	PositionsMinReplicas int           `key:"positions_min_replicas" default:"3" range:"1..16" help:"the relay refuses a positions topic with fewer replicas than this on a cluster of at least this many brokers (as many as it has on a smaller one); it creates a missing one with min(3, brokers) replicas, min.insync.replicas 2; 1 accepts any"`
	Owner                string        `key:"owner" help:"lease owner name (default host-pid-random)"`                                            // lease owner name; default host-pid-random
	LeaseTTL             time.Duration `key:"lease_ttl" default:"10s" range:"100ms..10m" help:"a crashed relay's shard is taken over after this"` // lease lifetime, renewed every LeaseTTL/4
	TxnTimeout           time.Duration `key:"txn_timeout" default:"30s" range:"1s..15m" help:"Kafka transaction timeout"`                         // Kafka transaction timeout

	RetryBackoff time.Duration `key:"retry_backoff" default:"1s" range:"1ms..1m" help:"first retry backoff after a failed batch (doubles)"` // after a failed publish, doubling up to MaxRetryBackoff
	// MaxRetryBackoff caps the doubling retry backoff (never below RetryBackoff).
	MaxRetryBackoff time.Duration `key:"max_retry_backoff" default:"5s" range:"1ms..10m" help:"retry backoff cap"`

	// Retention deletes published rows older than this, CleanupBatch rows per DELETE, every
	// CleanupInterval. KeepPublished (any negative value) keeps published rows forever; the
	// zero value stands for the default.
	Retention       time.Duration `key:"retention" default:"168h" range:"0..87600h" zero:"-1ns" help:"published outbox rows are deleted after this (0 keeps them)"`
	CleanupInterval time.Duration `key:"cleanup_interval" default:"1m" range:"1s..24h" help:"how often published rows past the retention are deleted"`
	CleanupBatch    int           `key:"cleanup_batch" default:"500" range:"1..100000" help:"rows per cleanup DELETE"`

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
	// batch waits, "read" just before the exactly-once relay reads a batch's rows in full,
	// "before-kafka-commit", "after-kafka-commit", "before-mark", "after-mark";
	// in exactly-once mode under Run the last two are called from the goroutine that marks
	// the batch in the background). Crash tests use it to exit the process there.
	Hook func(point string)
}

// KeepPublished as RelayConfig.Retention keeps published rows forever (any negative value
// does; the zero value stands for the default).
const KeepPublished time.Duration = -1

// NoHandOff as RelayConfig.HandOffBytes turns the hand-off off (any negative value does;
// the zero value stands for the default).
const NoHandOff = -1

// NoLinger as RelayConfig.Linger publishes a partial batch at once (any negative value
// does; the zero value stands for the default).
const NoLinger time.Duration = -1

// setDefaults fills the zero settings with their defaults.
func (c *RelayConfig) setDefaults() {
	settings.SetDefaults(c)
	if c.Table == "" {
		c.Table = "outbox"
	}
	if c.Linger < 0 {
		c.Linger = NoLinger
	}
	if c.HandOffBytes < 0 {
		c.HandOffBytes = NoHandOff
	}
	if c.Retention < 0 {
		c.Retention = KeepPublished
	}
	if c.Owner == "" {
		c.Owner = defaultOwner()
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
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if c.Linger >= c.LeaseTTL/2 {
		return fmt.Errorf("relay: linger %s must be below half the lease ttl (%s)", c.Linger, c.LeaseTTL)
	}
	if len(c.Shard) > 52 || len(c.Owner) > 191 || len(c.TransactionalID) > 190 {
		return errors.New("relay: shard (52), owner (191) or transactional id (190) too long")
	}
	if strings.ContainsAny(c.Shard, "#/") {
		return fmt.Errorf("relay: shard %q: '#' and '/' are reserved for shard names", c.Shard)
	}
	if err := kafkax.CheckTopicName(c.PositionsTopic); err != nil {
		return fmt.Errorf("relay: positions topic: %w", err)
	}
	return nil
}

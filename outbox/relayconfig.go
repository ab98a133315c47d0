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

// RelayConfig configures a Relay. The tags declare the stock router's relay.* settings with
// their key, default, range and help, as internal/settings reads them. So a relay wired by
// hand behaves as the stock binary's.
type RelayConfig struct {
	Table string // default "outbox"
	// BatchSize is the most rows per Kafka batch. In exactly-once mode a batch is a Kafka
	// transaction. Larger batches republish more after an abort. See docs/BENCHMARKS.md,
	// section "relay.batch_size 10000".
	BatchSize int `key:"batch_size" default:"10000" range:"1..10000" help:"events per Kafka transaction (larger: fewer commits, more republished after an abort; docs/BENCHMARKS.md, Why the defaults)"`
	// BatchBytes bounds a batch by the bytes of its events as read: their payloads, keys,
	// event ids, types, topics and headers. A batch stops at the first event that brings it
	// to BatchBytes or over, so it holds at least one event and at most BatchBytes plus one
	// event (MEDIUMBLOB: at most 16 MiB). With BatchSize it bounds the relay's memory.
	BatchBytes   int           `key:"batch_bytes" default:"16777216" range:"1024..1073741824" help:"bytes of events one batch reads and sends at most, besides the event that reaches it (bounds the relay's memory with relay.batch_size)"`
	PollInterval time.Duration `key:"poll_interval" default:"50ms" range:"1ms..1m" help:"relay sleep when nothing is pending; router run doubles it while the relay stays idle, up to 1s, and wakes the relay for the rows it commits"` // sleep when nothing is pending
	// IdlePollMax, when above PollInterval, lets a relay that Wake reaches poll less often
	// while it stays idle. Each read in a row that finds nothing doubles the wait, from
	// PollInterval up to IdlePollMax, and never beyond a quarter of LeaseTTL, at which the
	// lease is renewed. A read that finds rows, a failure or a Wake starts it over. Set it only
	// where Wake is called for the rows this process commits, as the router does: rows that
	// other processes commit then wait up to IdlePollMax for an idle relay. The zero value
	// polls every PollInterval.
	IdlePollMax time.Duration

	// Linger is how long a partial batch waits for more rows before it is published, as
	// Kafka's linger.ms does. When a read finds fewer than BatchSize pending rows, the relay
	// waits Linger once. It then reads again from the oldest pending row and publishes what it
	// finds, at most BatchSize rows. Under a steady trickle this makes fewer and bigger Kafka
	// transactions and database marks, for at most Linger of added latency. A full batch
	// never waits. Linger is at most 10s, and below half LeaseTTL. NoLinger, or any negative
	// value, publishes at once. No lock is held while lingering.
	Linger time.Duration `key:"linger" default:"5ms" range:"0..10s" zero:"-1ns" help:"a partial batch waits this long once for more rows before it is published (as Kafka's linger.ms); 0 publishes at once"`

	// HandOffBytes bounds the events a Writer of this process hands to this exactly-once
	// relay from the inbox's group-committed batches. The Writer's UseStatements pool must be
	// the relay's, and it must write the same table. Only MariaDB and PostgreSQL hand events
	// over. The relay still reads from the database which rows are pending, in id order, in
	// an index-only read. It takes their contents from the hand-off of handoff.go instead of
	// reading them back. A full hand-off takes no more until the relay drains it. NoHandOff,
	// or any negative value, turns it off. The zero value stands for the default.
	HandOffBytes int `key:"handoff_bytes" default:"4194304" range:"0..1073741824" zero:"-1" help:"bytes of committed events the router's batches hand to its exactly-once relay in memory, so it does not read them back (0 turns it off)"`

	LagBound time.Duration `key:"lag_bound" default:"1m" range:"1s..168h" help:"verify: unpublished rows older than this are a violation"` // an unpublished row older than this is a violation (verify)

	// Shard is the shard group, the one shard when Shards is 1. The settings from Shard to
	// TxnTimeout serve only the exactly-once mode of NewExactlyOnceRelay.
	Shard string `key:"shard" default:"default" help:"shard group of the outbox (one lease and one transactional.id per shard)"`

	// Shards splits the outbox into this many shards. A row belongs to shard MOD(key_hash,
	// Shards). key_hash is the CRC32 of the row's key, from migration 00005, or its hashtext
	// on PostgreSQL. So a key's events stay in one shard and in order. Each shard has its own
	// lease named Shard#i/n, its own transactional id TransactionalID-<i>of<n>, and its own
	// positions. The relays of a group spread the shards among themselves in relay_member,
	// and take over the shards of a dead one. All relays of a group must use the same count.
	// Relays that disagree refuse to publish. Change it only with a drained outbox and every
	// relay of the old count stopped.
	Shards int `key:"shards" default:"1" range:"1..256" help:"outbox shards (hash of the key mod shards): the group's relays spread them; change only with a drained outbox"`

	// TransactionalID is the Kafka transactional.id of the shard group, the same on every
	// relay of the group. The default is "onceflow-relay-<database>-<shard>", which the
	// router uses too. <database> is the pool's database, which CheckServer reads before the
	// first batch. <shard> is Shard. So relays of two databases that share a Kafka cluster,
	// such as a demo and production, never fence each other or read each other's positions.
	// The id holds no server identity. So a database restored on another server, or a
	// promoted replica, keeps its id. Two servers that hold databases of the same name and
	// share a Kafka cluster must set it, or set different Shards. Relay.TransactionalID
	// reports the id in use.
	TransactionalID string `key:"transactional_id" help:"Kafka transactional.id (default onceflow-relay-<database>-<shard>, so two databases never share positions or fence each other); the same on every instance of the shard"`

	PositionsTopic string `key:"positions_topic" default:"onceflow-relay-positions" help:"compacted topic of batch positions (created if missing)"` // compacted topic of relay positions, DefaultPositionsTopic
	// PositionsMinReplicas is the least replication factor the positions topic must have on
	// a cluster of at least that many brokers. On a smaller cluster the topic needs as many
	// replicas as there are brokers. An exactly-once relay checks it at each start. It
	// creates a missing topic with replication factor max(min(3, brokers), that need), and
	// with min.insync.replicas=2 when the factor is 3 or more. It refuses an existing topic
	// below the need with ErrPositionsReplication. 1 accepts any topic.
	PositionsMinReplicas int           `key:"positions_min_replicas" default:"3" range:"1..16" help:"the relay refuses a positions topic with fewer replicas than this on a cluster of at least this many brokers (as many as it has on a smaller one); it creates a missing one with min(3, brokers) replicas, min.insync.replicas 2; 1 accepts any"`
	Owner                string        `key:"owner" help:"lease owner name (default host-pid-random)"`                                            // lease owner name, default host-pid-random
	LeaseTTL             time.Duration `key:"lease_ttl" default:"10s" range:"100ms..10m" help:"a crashed relay's shard is taken over after this"` // lease lifetime, renewed every LeaseTTL/4
	TxnTimeout           time.Duration `key:"txn_timeout" default:"30s" range:"1s..15m" help:"Kafka transaction timeout"`                         // Kafka transaction timeout

	RetryBackoff time.Duration `key:"retry_backoff" default:"1s" range:"1ms..1m" help:"first retry backoff after a failed batch (doubles)"` // after a failed publish, doubling up to MaxRetryBackoff
	// MaxRetryBackoff caps the doubling retry backoff. The cap is never below RetryBackoff.
	MaxRetryBackoff time.Duration `key:"max_retry_backoff" default:"5s" range:"1ms..10m" help:"retry backoff cap"`

	// Retention deletes published rows older than this, CleanupBatch rows per DELETE, every
	// CleanupInterval. KeepPublished, or any negative value, keeps published rows forever.
	// The zero value stands for the default.
	Retention       time.Duration `key:"retention" default:"168h" range:"0..87600h" zero:"-1ns" help:"published outbox rows are deleted after this (0 keeps them)"`
	CleanupInterval time.Duration `key:"cleanup_interval" default:"1m" range:"1s..24h" help:"how often published rows past the retention are deleted"`
	CleanupBatch    int           `key:"cleanup_batch" default:"500" range:"1..100000" help:"rows per cleanup DELETE"`

	// Tune, when set, adjusts the Sarama config of the transactional producer and of the
	// position reader. Tests use it to inject a failing dialer.
	Tune func(*sarama.Config)

	// TracerProvider, when set, traces the relay. The relay then starts a producer span
	// named "send <topic>" for each published event whose row has a trace parent. A row has
	// one in trace_parent when its writer was traced. The span is a child of that stored
	// context. It lasts from the batch's send to its Kafka commit in exactly-once mode, or to
	// its ack in at-least-once mode. The record's traceparent header then carries the send
	// span's context. When TracerProvider is nil, the default, the relay starts no span. The
	// header then carries the stored trace parent as it is, so traces still cross the relay.
	TracerProvider trace.TracerProvider

	// Hook, when set, is called at named points of a batch. "linger" comes just before a
	// partial batch waits. "read" comes just before the exactly-once relay reads a batch's
	// rows in full. "parked-keys" comes before each read of the keys with parked events.
	// The others are "before-kafka-commit", "after-kafka-commit",
	// "before-mark" and "after-mark". In exactly-once mode under Run, the goroutine that
	// marks the batch in the background calls the last two. Crash tests use Hook to exit the
	// process at these points.
	Hook func(point string)
}

// KeepPublished as RelayConfig.Retention keeps published rows forever. Any negative value
// does. The zero value stands for the default.
const KeepPublished time.Duration = -1

// NoHandOff as RelayConfig.HandOffBytes turns the hand-off off. Any negative value does.
// The zero value stands for the default.
const NoHandOff = -1

// NoLinger as RelayConfig.Linger publishes a partial batch at once. Any negative value
// does. The zero value stands for the default.
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
// NewExactlyOnceRelay use it. WithDefaults().Validate() checks a config before a relay is
// built from it.
func (c RelayConfig) WithDefaults() RelayConfig {
	c.setDefaults()
	return c
}

// Validate reports the first invalid setting. It only checks and fills in nothing. So a
// zero setting that stands for a default is invalid here until WithDefaults fills it in.
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
	if c.IdlePollMax < 0 {
		return fmt.Errorf("relay: idle poll max %s is negative", c.IdlePollMax)
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

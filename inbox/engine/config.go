package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Config configures one Inbox, for one biz type. The tags declare the stock router's
// inbox.* settings with their key, default, range and help. Package internal/settings
// reads them.
type Config struct {
	BizType        string        // required, such as "coupon"
	Table          string        // "inbox" by default
	MaxAttempts    int           `key:"max_attempts" default:"5" range:"1..1000" help:"handler attempts before a message is quarantined"`
	BackoffInitial time.Duration `key:"backoff_initial" default:"100ms" range:"1ms..1h" help:"first retry backoff (doubles)"` // doubled per attempt
	BackoffMax     time.Duration `key:"backoff_max" default:"5s" range:"1ms..24h" help:"retry backoff cap"`
	MaxLockRetries int           // retries per delivery after a deadlock or lock wait, not counted as attempts, 100 by default
	MaxSteps       int           // Continue results allowed per attempt, 32 by default
	Retention      time.Duration `key:"retention" default:"720h" range:"1h..87600h" help:"inbox rows expire after this (30 days); must cover how far back Kafka can replay: a warning is logged at start when a topic keeps messages longer"` // expire_at = now + Retention
	// MaxPayloadBytes bounds a payload. A larger payload is poison, and is quarantined with
	// a bounded prefix, its size and its sha256. MaxPayloadBytes is at most
	// MaxPayloadLimit. CheckServer checks that the server's max_allowed_packet can carry it.
	MaxPayloadBytes int `key:"max_payload_bytes" default:"1048576" range:"1..16777215" help:"larger payloads are poison (quarantined with a 64 KiB prefix, size and sha256); checked against the server's max_allowed_packet at start"`
	// MaxMetadataBytes bounds a record's headers, its metadata as JSON. A record whose
	// headers are longer is poison, and its metadata is stored capped, marked by
	// MetadataTruncatedKey. MaxMetadataBytes is at most 65,535, the size of the metadata
	// column.
	MaxMetadataBytes int `key:"max_metadata_bytes" default:"32768" range:"256..65535" help:"records whose headers (as JSON) are longer are poison (stored capped); at most 65535"`
	// HandlerTimeout bounds each call into the plugin, to Prepare, Handle or HandleBatch. A
	// call that has not returned by then is abandoned. Its context is cancelled, its
	// transaction rolled back, and the attempt counts as failed. Once the attempts run out,
	// the reason is ReasonTimeout.
	HandlerTimeout time.Duration `key:"handler_timeout" default:"30s" range:"1ms..24h" help:"a plugin call (prepare, handle) that has not returned by then is abandoned and counts as a failed attempt (reason timeout)"`
	// StepsPerTx runs up to this many consecutive steps of a multi-step handler in one
	// transaction. It is at most MaxSteps. With 1, every step commits on its own, so no
	// lock is held across the next step's slow external call. Raise it when steps make no
	// slow calls. There are then fewer commits with the same guarantees, because each
	// step's effect and transition still commit together.
	StepsPerTx int `key:"steps_per_transaction" default:"1" range:"1..32" help:"consecutive handler steps per transaction; 1: every state transition commits alone (no lock held across the next step's slow call); 3: a whole coupon grant in one commit, same guarantees"`
	// MaxInFlightCalls bounds the outside calls of this inbox's deliveries running at once.
	// The calls are an inbox.Preparer's Prepare. The one-at-a-time path of Process and the
	// inbox's Batcher both take their slots from this one bound.
	MaxInFlightCalls int `key:"max_in_flight_calls" default:"8192" range:"1..1000000" after:"batch_workers" help:"outside calls running at once per plugin (its Prepare, each prepared as soon as the delivery arrives): group commit and the one-at-a-time path share them; calls in flight ÷ call time bounds the throughput of slow calls"`
	// DelayedRetries is how many delayed redeliveries a delivery gets before it is
	// quarantined. A delivery's immediate attempts may run out with a retryable failure,
	// retries_exhausted or timeout. The delivery is then kept as a 'failed' row with reason
	// 'delayed', and acked. The redeliverer, inboxops.Redeliverer, runs it again from its
	// stored payload after DelayedBackoff, doubling up to DelayedBackoffMax. A panic,
	// poison, a conflict or inbox.ErrPermanent is quarantined at once. A negative value turns
	// delayed redelivery off. The stock router's configured 0 stands for it.
	DelayedRetries    int           `key:"delayed_retries" default:"6" range:"0..1000" zero:"-1" help:"delayed redeliveries of a delivery whose attempts ran out (retries exhausted, timeout) before it is quarantined: its row waits, the partition moves on; 0 turns them off"`
	DelayedBackoff    time.Duration `key:"delayed_backoff" default:"30s" range:"1ms..24h" help:"wait before the first delayed redelivery (doubles per round)"`
	DelayedBackoffMax time.Duration `key:"delayed_backoff_max" default:"10m" range:"1ms..168h" help:"delayed redelivery wait cap"`
	// DelayedHoldsKafkaKey keeps a delivery whose row waits for a delayed redelivery
	// unacked until the row ends, done or quarantined. A copy that finds the row waiting is
	// kept unacked too. The subscriber hands out no later message of its Kafka key
	// meanwhile. So the messages of one Kafka key are processed in their order, even across
	// an outage. The price is that the partition's committed offset stays behind the
	// waiting message. The message holds a place of the partition's window, kafka.window,
	// as long as it waits. Without DelayedHoldsKafkaKey, order holds per business key only.
	// Later messages of other business keys under the same Kafka key go on.
	DelayedHoldsKafkaKey bool `key:"delayed_holds_kafka_key" default:"false" help:"a message waiting for its delayed redelivery stays unacked until its row ends, so later messages of its Kafka key wait behind it (order per Kafka key across an outage; the partition's committed offset waits too); false: order per business key only"`
	// RedeliverEvery is how often the redeliverer looks for due rows, 1s by default.
	RedeliverEvery time.Duration
	// CallLease is how long a key's call lease outlives its owner's last renewal. It is how
	// long other routers wait for a key whose router died or froze. It is 10s by default.
	// calls.go describes the lease.
	CallLease time.Duration
	// The circuit breaker opens when at least BreakerFailureRatio of the last 10 s of
	// attempts failed, and there were at least BreakerMinCalls. Deliveries then wait before
	// their next attempt until BreakerOpenFor has passed. No attempt is spent, and no
	// delivery is quarantined. Then one probe runs. Its success closes the breaker. Its
	// failure opens the breaker again for twice as long, up to a minute.
	BreakerFailureRatio float64       `key:"breaker_failure_ratio" default:"0.9" range:"0.01..1" help:"circuit breaker: share of failed attempts in the last 10 s that stops the plugin's deliveries"`
	BreakerMinCalls     int           `key:"breaker_min_calls" default:"20" range:"1..1000000" help:"circuit breaker: attempts in the last 10 s before it can open"`
	BreakerOpenFor      time.Duration `key:"breaker_open_for" default:"5s" range:"1ms..1h" help:"circuit breaker: wait before a probe delivery (doubles after a failed probe, up to 1m)"`
	// BreakerOff turns the circuit breaker off. The stock router sets it when
	// inbox.breaker_enabled is false.
	BreakerOff bool
	// KeyLogField names the business key in log lines, such as "order_id". It is
	// "dedup_key" by default.
	KeyLogField string
	// TracerProvider, when set, traces every delivery. A delivery's span continues the
	// trace of the record's traceparent header. The handler's ctx carries the span of its
	// step, which outbox.Writer.Add stores with the events. By default it is nil, and
	// nothing is traced.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	settings.SetDefaults(c)
	if c.Table == "" {
		c.Table = "inbox"
	}
	if c.MaxLockRetries == 0 {
		c.MaxLockRetries = 100
	}
	if c.MaxSteps == 0 {
		c.MaxSteps = 32
	}
	if c.CallLease == 0 {
		c.CallLease = 10 * time.Second
	}
	if c.RedeliverEvery == 0 {
		c.RedeliverEvery = time.Second
	}
	if c.KeyLogField == "" {
		c.KeyLogField = "dedup_key"
	}
}

// WithDefaults returns c with its zero settings set to their defaults, as New uses it. The
// stock router's inbox.* defaults in its settings list are these values. Call Validate on
// the result to check a config before an Inbox is built from it.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Validate reports the first invalid setting. It only checks, and fills in nothing. So a
// zero setting that stands for a default is invalid here until WithDefaults fills the
// default in.
func (c Config) Validate() error { return c.validate() }

func (c *Config) validate() error {
	if c.BizType == "" {
		return errors.New("inbox: biz type is empty")
	}
	if len(c.BizType) > 64 {
		return fmt.Errorf("inbox: biz type %q longer than 64 bytes", c.BizType)
	}
	if err := dbx.CheckIdent("inbox table", c.Table); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	if c.StepsPerTx > c.MaxSteps {
		return fmt.Errorf("inbox: steps per transaction %d above max steps %d", c.StepsPerTx, c.MaxSteps)
	}
	if c.BackoffMax < c.BackoffInitial {
		return fmt.Errorf("inbox: backoff %s..%s is not a range", c.BackoffInitial, c.BackoffMax)
	}
	if c.DelayedBackoffMax < c.DelayedBackoff {
		return fmt.Errorf("inbox: delayed backoff %s..%s is not a range", c.DelayedBackoff, c.DelayedBackoffMax)
	}
	if c.CallLease < 30*time.Millisecond {
		return fmt.Errorf("inbox: call lease %s is shorter than 30ms", c.CallLease)
	}
	if c.RedeliverEvery < 0 {
		return fmt.Errorf("inbox: redeliver interval %s is negative", c.RedeliverEvery)
	}
	return nil
}

// MaxPayloadLimit is the largest inbox.max_payload_bytes. The payload column is a
// MEDIUMBLOB, which holds 16 MiB less one byte.
const MaxPayloadLimit = 1<<24 - 1

// packetBytes is the largest statement the inbox sends for one delivery. Parameters are
// interpolated into the statement, and escaping can double binary bytes. The other
// columns, such as the key and the error text, add to it.
func (c Config) packetBytes() int64 {
	return 2*int64(c.MaxPayloadBytes+c.MaxMetadataBytes) + 64<<10
}

// CheckServer reports whether the database can run this inbox. Call it at start-up.
//
// The pool's sessions must run at READ COMMITTED, as dbx.CheckIsolation checks. Under
// REPEATABLE READ the claims of new keys take gap locks that block each other and
// deadlock. A pool that does not run at READ COMMITTED is refused with an error wrapping
// dbx.ErrIsolation. dbx.InTx refuses its transactions too, at their first use.
//
// A statement carrying a payload of MaxPayloadBytes must also fit the server's
// max_allowed_packet. Otherwise the server would close the connection on it, and the
// delivery would be retried forever as "database unreachable". PostgreSQL has no such
// limit below its 1 GB message, so MaxPayloadLimit always fits there.
func (ib *Inbox) CheckServer(ctx context.Context) error {
	if err := dbx.CheckIsolation(ctx, ib.db); err != nil {
		return fmt.Errorf("inbox %s: %w", ib.cfg.BizType, err)
	}
	if ib.d.IsPostgres() {
		return nil
	}
	var packet int64
	if err := ib.db.QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&packet); err != nil {
		return fmt.Errorf("inbox: read max_allowed_packet: %w", err)
	}
	if need := ib.cfg.packetBytes(); need > packet {
		return fmt.Errorf("inbox %s: max payload %d bytes needs statements of up to %d bytes, above the server's max_allowed_packet %d: lower inbox.max_payload_bytes to %d or raise max_allowed_packet",
			ib.cfg.BizType, ib.cfg.MaxPayloadBytes, need, packet, max(1, (packet-64<<10)/2-int64(ib.cfg.MaxMetadataBytes)))
	}
	return nil
}

func (c Config) backoff(attempt int) time.Duration {
	d := c.BackoffInitial
	for i := 1; i < attempt && d < c.BackoffMax; i++ {
		d *= 2
	}
	return min(d, c.BackoffMax)
}

// delayedBackoff is the wait before delayed round rounds+1, after rounds rounds.
func (c Config) delayedBackoff(rounds int) time.Duration {
	d := c.DelayedBackoff
	for i := 0; i < rounds && d < c.DelayedBackoffMax; i++ {
		d *= 2
	}
	return min(d, c.DelayedBackoffMax)
}

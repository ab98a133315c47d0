package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// MaxKeyLen is the longest business key accepted (the unique index must hold key+suffix).
const MaxKeyLen = 128

// Config configures one Inbox (one biz type).
type Config struct {
	BizType        string        // required, e.g. "coupon"
	Table          string        // default "inbox"
	MaxAttempts    int           // handler attempts before quarantine; default 5
	BackoffInitial time.Duration // default 100ms, doubled per attempt
	BackoffMax     time.Duration // default 5s
	MaxLockRetries int           // deadlock / lock-wait retries per delivery, not counted as attempts; default 100
	MaxSteps       int           // Continue results allowed per attempt; default 32
	// StepsPerTx runs up to this many consecutive steps of a multi-step handler in one
	// transaction. Default 1: every step commits on its own, so no lock is held across the
	// next step's slow external call. Raise it when steps make no slow calls: fewer commits,
	// the same guarantees (each step's effect and transition still commit together).
	StepsPerTx int
	Retention  time.Duration // expire_at = now + Retention; default 30 days
	// MaxPayloadBytes: larger payloads are poison, quarantined with a bounded prefix, their
	// size and sha256; default 1 MiB, at most MaxPayloadLimit. CheckServer checks that the
	// server's max_allowed_packet can carry it.
	MaxPayloadBytes int
	// MaxMetadataBytes: a record whose headers (metadata, as JSON) are longer is poison, its
	// metadata stored capped (MetadataTruncatedKey); default 32 KiB, at most 65,535 (the
	// metadata column).
	MaxMetadataBytes int
	// HandlerTimeout bounds each call into the plugin (Prepare, Handle, HandleBatch). One
	// that has not returned by then is abandoned: its context is cancelled, its transaction
	// rolled back, and the attempt counts as failed (ReasonTimeout once attempts run out).
	// Default 30s.
	HandlerTimeout time.Duration
	// MaxInFlightCalls bounds the Preparer.Prepare calls (a plain handler's slow outside
	// calls) running at once in this inbox's deliveries; default 8192. The Batcher has its
	// own bound for BatchPreparer (BatchConfig.MaxInFlightCalls).
	MaxInFlightCalls int
	// KeyLogField names the business key in log lines (e.g. "order_id"); default "dedup_key".
	KeyLogField string
	// TracerProvider, when set, traces every delivery (trace.go): its span continues the trace
	// of the record's traceparent header, and the handler's ctx carries the span of its step,
	// which outbox.Writer.Add stores with the events. Nil (the default): nothing is traced.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = "inbox"
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.BackoffInitial == 0 {
		c.BackoffInitial = 100 * time.Millisecond
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.MaxLockRetries == 0 {
		c.MaxLockRetries = 100
	}
	if c.MaxSteps == 0 {
		c.MaxSteps = 32
	}
	if c.StepsPerTx == 0 {
		c.StepsPerTx = 1
	}
	if c.Retention == 0 {
		c.Retention = 30 * 24 * time.Hour
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = 1 << 20
	}
	if c.MaxMetadataBytes == 0 {
		c.MaxMetadataBytes = 32 << 10
	}
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = 30 * time.Second
	}
	if c.MaxInFlightCalls == 0 {
		c.MaxInFlightCalls = 8192
	}
	if c.KeyLogField == "" {
		c.KeyLogField = "dedup_key"
	}
}

// WithDefaults returns c with its zero settings set to their defaults, as New uses it; the
// stock router's defaults (inbox.* in its settings list) are these values.
// WithDefaults().Validate() checks a config before an Inbox is built from it.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// Validate reports the first invalid setting. It only checks: a zero setting that stands
// for a default is invalid here until the default is filled in (WithDefaults).
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
	if c.StepsPerTx < 1 || c.StepsPerTx > c.MaxSteps {
		return fmt.Errorf("inbox: steps per transaction %d outside 1..%d", c.StepsPerTx, c.MaxSteps)
	}
	if c.MaxAttempts < 1 {
		return fmt.Errorf("inbox: max attempts %d < 1", c.MaxAttempts)
	}
	if c.BackoffInitial < 0 || c.BackoffMax < c.BackoffInitial {
		return fmt.Errorf("inbox: backoff %s..%s is not a range", c.BackoffInitial, c.BackoffMax)
	}
	if c.Retention < time.Hour {
		return fmt.Errorf("inbox: retention %s is shorter than an hour", c.Retention)
	}
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > MaxPayloadLimit {
		return fmt.Errorf("inbox: max payload %d bytes outside 1..%d (the payload column's size)", c.MaxPayloadBytes, MaxPayloadLimit)
	}
	if c.MaxMetadataBytes < 256 || c.MaxMetadataBytes > maxMetadataLimit {
		return fmt.Errorf("inbox: max metadata %d bytes outside 256..%d (the metadata column's size)", c.MaxMetadataBytes, maxMetadataLimit)
	}
	if c.HandlerTimeout < time.Millisecond || c.HandlerTimeout > 24*time.Hour {
		return fmt.Errorf("inbox: handler timeout %s outside 1ms..24h", c.HandlerTimeout)
	}
	if c.MaxInFlightCalls < 1 || c.MaxInFlightCalls > 1_000_000 {
		return fmt.Errorf("inbox: max in-flight calls %d outside 1..1000000", c.MaxInFlightCalls)
	}
	if c.MaxAttempts > 1000 {
		return fmt.Errorf("inbox: max attempts %d above 1000", c.MaxAttempts)
	}
	return nil
}

// MaxPayloadLimit is the largest inbox.max_payload_bytes: the payload column is a
// MEDIUMBLOB (16 MiB - 1).
const MaxPayloadLimit = 1<<24 - 1

// maxMetadataLimit is the metadata column's size (TEXT).
const maxMetadataLimit = 1<<16 - 1

// packetBytes is the largest statement the inbox sends for one delivery: parameters are
// interpolated into the statement, which can double binary bytes (escaping), plus the
// other columns (key, error text, ...).
func (c Config) packetBytes() int64 {
	return 2*int64(c.MaxPayloadBytes+c.MaxMetadataBytes) + 64<<10
}

// CheckServer reports whether the database can run this inbox; call it at start-up. The
// pool's sessions must run at READ COMMITTED (dbx.CheckIsolation: under REPEATABLE READ
// the claims of new keys take gap locks that block each other and deadlock); a pool that
// does not is refused with an error wrapping dbx.ErrIsolation (its transactions are refused
// too, at their first use: dbx.InTx). And a statement carrying a payload of
// MaxPayloadBytes must fit the server's max_allowed_packet, or the server would close the
// connection on it and the delivery would be retried forever as "database unreachable".
func (ib *Inbox) CheckServer(ctx context.Context) error {
	if err := dbx.CheckIsolation(ctx, ib.db); err != nil {
		return fmt.Errorf("inbox %s: %w", ib.cfg.BizType, err)
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

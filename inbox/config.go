package inbox

import (
	"errors"
	"fmt"
	"time"

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
	StepsPerTx      int
	Retention       time.Duration // expire_at = now + Retention; default 30 days
	MaxPayloadBytes int           // larger payloads are poison; default 1 MiB
	// KeyLogField names the business key in log lines (e.g. "order_id"); default "dedup_key".
	KeyLogField string
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
	if c.KeyLogField == "" {
		c.KeyLogField = "dedup_key"
	}
}

// Validate reports the first invalid setting.
func (c *Config) Validate() error {
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
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > 16<<20 {
		return fmt.Errorf("inbox: max payload %d bytes outside 1..16MiB", c.MaxPayloadBytes)
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

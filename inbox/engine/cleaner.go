package engine

import (
	"fmt"
	"time"

	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// CleanerConfig configures the retention cleaner, inboxops.Cleaner. The tags declare the
// stock router's inbox.cleanup_* settings with their key, default, range and help. Package
// internal/settings reads them.
type CleanerConfig struct {
	Table     string        // default "inbox"
	Interval  time.Duration `key:"cleanup_interval" default:"1h" range:"1s..24h" help:"how often expired done rows are deleted"` // between sweeps
	BatchSize int           `key:"cleanup_batch" default:"500" range:"1..100000" help:"rows per cleanup DELETE"`                 // rows per DELETE
	// Replies makes the cleaner also delete the stored responses of HTTP commands with
	// their rows. They are in ReplyTable of Table. Set it when a command is served.
	Replies bool
}

// WithDefaults returns c with its zero settings set to their defaults, as the cleaner uses
// it. The stock router's inbox.cleanup_* defaults are these values.
func (c CleanerConfig) WithDefaults() CleanerConfig {
	c.setDefaults()
	return c
}

func (c *CleanerConfig) setDefaults() {
	settings.SetDefaults(c)
	if c.Table == "" {
		c.Table = "inbox"
	}
}

// Validate reports the first invalid setting. It only checks, so call WithDefaults first.
func (c CleanerConfig) Validate() error {
	if err := dbx.CheckIdent("inbox table", c.Table); err != nil {
		return fmt.Errorf("inbox cleaner: %w", err)
	}
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("inbox cleaner: %w", err)
	}
	return nil
}

package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// CleanerConfig configures the retention cleaner.
type CleanerConfig struct {
	Table     string        // default "inbox"
	BatchSize int           // rows per DELETE; default 500
	Interval  time.Duration // between sweeps; default 1h
}

func (c *CleanerConfig) setDefaults() {
	if c.Table == "" {
		c.Table = "inbox"
	}
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	if c.Interval == 0 {
		c.Interval = time.Hour
	}
}

// Cleaner deletes expired 'done' rows in small batches so the inbox never becomes a second
// main table. 'processing' and 'failed' rows are kept for the operator whatever their age.
type Cleaner struct {
	db     *sql.DB
	cfg    CleanerConfig
	logger watermill.LoggerAdapter
	types  string // the biz types present
	del    string
}

// NewCleaner builds a Cleaner.
func NewCleaner(db *sql.DB, cfg CleanerConfig, logger watermill.LoggerAdapter) (*Cleaner, error) {
	cfg.setDefaults()
	if err := dbx.CheckIdent("inbox table", cfg.Table); err != nil {
		return nil, fmt.Errorf("inbox cleaner: %w", err)
	}
	if cfg.BatchSize < 1 || cfg.Interval < time.Second {
		return nil, fmt.Errorf("inbox cleaner: batch %d / interval %s out of range", cfg.BatchSize, cfg.Interval)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	// Both read idx_biz_status_expire (biz_type, status, expire_at) (migrations/00007): the
	// DISTINCT jumps from one biz type to the next, each DELETE is a range of it.
	return &Cleaner{db: db, cfg: cfg, logger: logger,
		types: fmt.Sprintf("SELECT DISTINCT biz_type FROM %s", cfg.Table),
		del:   fmt.Sprintf("DELETE FROM %s WHERE biz_type = ? AND status = 'done' AND expire_at < ? LIMIT %d", cfg.Table, cfg.BatchSize)}, nil
}

// RunOnce deletes every 'done' row that expired before now, biz type by biz type, one batch
// per statement.
func (c *Cleaner) RunOnce(ctx context.Context, now time.Time) (int64, error) {
	var types []string
	rows, err := c.db.QueryContext(ctx, c.types)
	if err != nil {
		return 0, fmt.Errorf("inbox cleaner: list biz types: %w", err)
	}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return 0, fmt.Errorf("inbox cleaner: list biz types: %w", err)
		}
		types = append(types, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("inbox cleaner: list biz types: %w", err)
	}
	var total int64
	for _, t := range types {
		for {
			r, err := c.db.ExecContext(ctx, c.del, t, now.UTC())
			if err != nil {
				return total, fmt.Errorf("inbox cleaner: %s: %w", t, err)
			}
			n, err := r.RowsAffected()
			if err != nil {
				return total, fmt.Errorf("inbox cleaner: %s: %w", t, err)
			}
			total += n
			if n < int64(c.cfg.BatchSize) {
				break
			}
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
		}
	}
	return total, nil
}

// Run sweeps every Interval until ctx is cancelled.
func (c *Cleaner) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		n, err := c.RunOnce(ctx, time.Now())
		if err != nil && ctx.Err() == nil {
			c.logger.Error("inbox cleanup failed", err, nil)
		} else if n > 0 {
			c.logger.Info("inbox cleanup", watermill.LogFields{"deleted": n})
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

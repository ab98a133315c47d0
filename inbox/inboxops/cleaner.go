package inboxops

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Cleaner deletes expired 'done' rows in small batches so the inbox never becomes a second
// main table. 'processing' and 'failed' rows are kept for the operator whatever their age.
//
// It reads the oldest 'done' rows of each biz type in receive order. It uses the inbox's
// one secondary index, on biz_type, status and created_at, from migration 00008. It
// deletes the rows whose expire_at passed, and stops at the first that has not. expire_at
// is created_at plus inbox.retention, so receive order is expiry order. A sweep reads only
// the rows it deletes and one batch more. When inbox.retention is shortened, rows received
// later under the shorter retention wait for the older rows to expire first. So they are
// deleted late, never early.
type Cleaner struct {
	db     *sql.DB
	d      dbx.Dialect
	cfg    engine.CleanerConfig
	logger watermill.LoggerAdapter
	types  string // the biz types present
	oldest string // a biz type's oldest 'done' rows, and whether each has expired
	del    string // the expired ones among them, by id (checked again: a replay may reopen one)
	delRep string // their stored command responses (engine.CleanerConfig.Replies), deleted first in the same transaction
}

// NewCleaner builds a Cleaner.
func NewCleaner(db *sql.DB, cfg engine.CleanerConfig, logger watermill.LoggerAdapter) (*Cleaner, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	// The DISTINCT jumps from one biz type to the next in the index. oldest reads a range
	// of it in order, by created_at, then by the primary key the index ends with.
	d := dbx.DialectOf(db)
	var delRep string
	switch {
	case cfg.Replies && d.IsPostgres():
		delRep = fmt.Sprintf("DELETE FROM %s r USING %s i WHERE i.id = r.inbox_id AND i.status = 'done' AND i.expire_at < ? AND i.id IN ", engine.ReplyTable(cfg.Table), cfg.Table)
	case cfg.Replies:
		delRep = fmt.Sprintf("DELETE r FROM %s r JOIN %s i ON i.id = r.inbox_id WHERE i.status = 'done' AND i.expire_at < ? AND i.id IN ", engine.ReplyTable(cfg.Table), cfg.Table)
	}
	return &Cleaner{db: db, d: d, cfg: cfg, logger: logger, delRep: delRep,
		types:  fmt.Sprintf("SELECT DISTINCT biz_type FROM %s", cfg.Table),
		oldest: d.Rebind(fmt.Sprintf("SELECT id, expire_at < ? FROM %s WHERE biz_type = ? AND status = 'done' ORDER BY created_at, id LIMIT %d", cfg.Table, cfg.BatchSize)),
		del:    fmt.Sprintf("DELETE FROM %s WHERE status = 'done' AND expire_at < ? AND id IN ", cfg.Table)}, nil
}

// RunOnce deletes every 'done' row that expired before now. It goes biz type by biz type,
// one batch per statement, oldest first, as Cleaner describes.
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
			n, more, err := c.sweep(ctx, t, now.UTC())
			total += n
			if err != nil {
				return total, fmt.Errorf("inbox cleaner: %s: %w", t, err)
			}
			if !more {
				break
			}
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
		}
	}
	return total, nil
}

// sweep deletes the expired rows among the oldest BatchSize 'done' rows of bizType. more
// reports whether the next batch may hold expired rows too.
func (c *Cleaner) sweep(ctx context.Context, bizType string, now time.Time) (deleted int64, more bool, err error) {
	rows, err := c.db.QueryContext(ctx, c.oldest, now, bizType)
	if err != nil {
		return 0, false, err
	}
	var ids []any
	read, reachedLive := 0, false
	for rows.Next() {
		var id int64
		var expired bool
		if err := rows.Scan(&id, &expired); err != nil {
			rows.Close()
			return 0, false, err
		}
		read++
		if !expired {
			reachedLive = true
			break
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, false, err
	}
	if len(ids) == 0 {
		return 0, false, nil
	}
	in := "(" + strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + ")"
	args := append([]any{now}, ids...)
	var n int64
	err = dbx.InTx(ctx, c.db, func(tx *sql.Tx) error {
		if c.delRep != "" {
			if _, err := tx.ExecContext(ctx, c.d.Rebind(c.delRep+in), args...); err != nil {
				return fmt.Errorf("delete command responses: %w", err)
			}
		}
		r, err := tx.ExecContext(ctx, c.d.Rebind(c.del+in), args...)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return 0, false, err
	}
	// A full batch of expired rows was deleted, so there may be more. A row reopened by a
	// replay in between is left, and ends the sweep rather than being read again.
	return n, !reachedLive && read == c.cfg.BatchSize && n == int64(len(ids)), nil
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

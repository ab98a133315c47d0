package engine

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/onceflow/onceflow/inbox"
)

// RedeliveryObserver, when the inbox's Observer implements it, receives the outcome of every
// delayed redelivery, such as for metrics.
type RedeliveryObserver interface {
	Redelivered(bizType string, r Result)
}

// redeliverPage is how many due rows one look reads. redeliverConcurrency is how many of
// them run at once. Each row has its own key, so their order does not matter. A slow or
// hanging handler holds one slot, not the whole backlog.
const (
	redeliverPage        = 100
	redeliverConcurrency = 16
)

// RunRedeliveries runs the inbox's due delayed redeliveries with RedeliverDue, every
// Config.RedeliverEvery until ctx ends. It then returns nil. Several routers may run it on
// one inbox table, because one of them at a time claims each row.
func (ib *Inbox) RunRedeliveries(ctx context.Context) error {
	if ib.cfg.DelayedRetries <= 0 || ib.replyQuery != "" {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(ib.cfg.RedeliverEvery)
	defer t.Stop()
	for {
		if _, err := ib.RedeliverDue(ctx, time.Now()); err != nil && ctx.Err() == nil {
			ib.logger.Error("delayed redelivery", err, nil)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// redeliveryLease is how long a claimed row is left to the redeliverer that claimed it. It
// is long enough for the row's immediate attempts. Should a run outlast it, another
// redeliverer may run the row too. The row's lock and its 'done' commit still let only one
// of them run the handler to its end.
func (c Config) redeliveryLease() time.Duration {
	return time.Duration(c.MaxAttempts) * (c.HandlerTimeout + c.BackoffMax)
}

// RedeliverDue runs the rows waiting for a delayed redelivery whose retry_at is before now,
// earliest first. It runs each from its stored message through Process, as a replay runs a
// row. The row is the dedup line, and the handler's effects and its 'done' commit together.
// A row ends done, delayed again for its next round, or quarantined when its rounds are
// used up. Each row is first claimed by moving its retry_at past a lease, in one
// conditional UPDATE. So two routers never run it at once. Up to redeliverConcurrency rows
// run at once. Nothing starts while the breaker is open. RedeliverDue returns the number
// of rows it ran.
func (ib *Inbox) RedeliverDue(ctx context.Context, now time.Time) (int, error) {
	t := ib.cfg.Table
	rows, err := ib.db.QueryContext(ctx, ib.d.Rebind(fmt.Sprintf(`SELECT id FROM %s WHERE biz_type = ? AND status = 'failed' AND reason = 'delayed' AND retry_at <= ?
 ORDER BY retry_at, id LIMIT %d`, t, redeliverPage)), ib.cfg.BizType, now.UTC())
	if err != nil {
		return 0, fmt.Errorf("inbox %s: due redeliveries: %w", ib.cfg.BizType, err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fmt.Errorf("inbox %s: due redeliveries: %w", ib.cfg.BizType, err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("inbox %s: due redeliveries: %w", ib.cfg.BizType, err)
	}
	claim := ib.d.Rebind(fmt.Sprintf(`UPDATE %s SET retry_at = ? WHERE id = ? AND status = 'failed' AND reason = 'delayed' AND retry_at <= ?`, t))
	load := ib.d.Rebind(fmt.Sprintf(`SELECT message_uuid, topic, kafka_partition, kafka_offset, payload, metadata, tombstone FROM %s WHERE id = ?`, t))
	var (
		wg    sync.WaitGroup
		slots = make(chan struct{}, redeliverConcurrency)
		mu    sync.Mutex
		ran   int
		errs  []error
	)
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(errs) > 0
	}
	for _, id := range ids {
		if ib.br.status().State == BreakerOpen || failed() {
			break // the breaker's probe decides first; the rows stay due
		}
		r, err := ib.db.ExecContext(ctx, claim, time.Now().Add(ib.cfg.redeliveryLease()).UTC(), id, now.UTC())
		if err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("inbox %s: claim redelivery of row %d: %w", ib.cfg.BizType, id, err))
			mu.Unlock()
			break
		}
		if n, err := r.RowsAffected(); err != nil || n != 1 {
			continue // another router's, or no longer waiting
		}
		var uuid string
		var src inbox.Source
		var payload []byte
		var meta sql.NullString
		var tombstone bool
		if err := ib.db.QueryRowContext(ctx, load, id).Scan(&uuid, &src.Topic, &src.Partition, &src.Offset, &payload, &meta, &tombstone); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("inbox %s: load row %d: %w", ib.cfg.BizType, id, err))
			mu.Unlock()
			break
		}
		if tombstone {
			payload = nil
		}
		msg := message.NewMessage(uuid, payload)
		if meta.Valid {
			md := map[string]string{}
			if err := json.Unmarshal([]byte(meta.String), &md); err == nil {
				for k, v := range md {
					msg.Metadata.Set(k, v)
				}
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break // the claimed row runs again after its lease
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			res, err := ib.run(ctx, msg, src, runOpts{ProcessOptions: ProcessOptions{Reopen: true}, redelivery: true})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err) // the row keeps its lease and runs again after it
				return
			}
			ran++
			ib.logger.Info("delayed redelivery", watermill.LogFields{ib.cfg.KeyLogField: res.Key, "inbox_id": id, "outcome": string(res.Outcome)})
			if o, ok := ib.obs.(RedeliveryObserver); ok {
				o.Redelivered(ib.cfg.BizType, res)
			}
		}()
	}
	wg.Wait()
	return ran, errors.Join(errs...)
}

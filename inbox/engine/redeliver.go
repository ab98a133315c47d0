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
//
// A look that finds no row of the biz type waiting for a delayed redelivery, due or not,
// doubles the wait before the next one, up to redeliverIdleMax. A row this inbox delays
// ends that wait at once. So an idle router does not query the inbox every second, and a
// row another process delayed is found within redeliverIdleMax. Its own router, while it
// runs, redelivers it on time.
func (ib *Inbox) RunRedeliveries(ctx context.Context) error {
	if ib.cfg.DelayedRetries <= 0 || ib.replyQuery != "" {
		<-ctx.Done()
		return nil
	}
	idle := 0 // looks in a row that found no delayed row
	for {
		_, waiting, err := ib.redeliverDue(ctx, time.Now())
		if err != nil && ctx.Err() == nil {
			ib.logger.Error("delayed redelivery", err, nil)
		}
		wait := ib.cfg.RedeliverEvery
		if err == nil && !waiting {
			for range min(idle, 16) {
				wait = min(2*wait, max(redeliverIdleMax, ib.cfg.RedeliverEvery))
			}
			idle++
		} else {
			idle = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-ib.delayed:
			t.Stop()
			idle = 0
		}
	}
}

// RedeliveryLooks is how many times the inbox looked for due delayed redeliveries.
func (ib *Inbox) RedeliveryLooks() int64 { return ib.looks.Load() }

// redeliverIdleMax is the longest wait of RunRedeliveries between two looks that find no
// delayed row.
const redeliverIdleMax = 8 * time.Second

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
	ran, _, err := ib.redeliverDue(ctx, now)
	return ran, err
}

// redeliverDue is RedeliverDue. It also reports whether the look found a row waiting for a
// delayed redelivery, due or not.
func (ib *Inbox) redeliverDue(ctx context.Context, now time.Time) (ran int, waiting bool, err error) {
	ib.looks.Add(1)
	t := ib.cfg.Table
	// One read finds the due rows and whether any row waits: the earliest rows of the biz
	// type waiting for a delayed redelivery, due first.
	rows, err := ib.db.QueryContext(ctx, ib.d.Rebind(fmt.Sprintf(`SELECT id, CASE WHEN retry_at <= ? THEN 1 ELSE 0 END FROM %s WHERE biz_type = ? AND status = 'failed' AND reason = 'delayed'
 ORDER BY retry_at, id LIMIT %d`, t, redeliverPage)), now.UTC(), ib.cfg.BizType)
	if err != nil {
		return 0, false, fmt.Errorf("inbox %s: due redeliveries: %w", ib.cfg.BizType, err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		var due int
		if err := rows.Scan(&id, &due); err != nil {
			rows.Close()
			return 0, false, fmt.Errorf("inbox %s: due redeliveries: %w", ib.cfg.BizType, err)
		}
		waiting = true
		if due == 1 {
			ids = append(ids, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("inbox %s: due redeliveries: %w", ib.cfg.BizType, err)
	}
	claim := ib.d.Rebind(fmt.Sprintf(`UPDATE %s SET retry_at = ? WHERE id = ? AND status = 'failed' AND reason = 'delayed' AND retry_at <= ?`, t))
	load := ib.d.Rebind(fmt.Sprintf(`SELECT message_uuid, topic, kafka_partition, kafka_offset, payload, metadata, tombstone FROM %s WHERE id = ?`, t))
	var (
		wg    sync.WaitGroup
		slots = make(chan struct{}, redeliverConcurrency)
		mu    sync.Mutex
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
	return ran, waiting, errors.Join(errs...)
}

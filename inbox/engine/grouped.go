package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/internal/txdefer"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Group commit for plain handlers works as follows. A Batcher whose handler is not a
// inbox.BatchHandler claims the batch's rows with one multi-row statement. It then runs each
// delivery's Handle, one after another, in the batch's transaction.
//
// A batch first runs without savepoints, because a savepoint costs about what a small
// INSERT does. See docs/BENCHMARKS.md, section "Savepoints only after a failure". When a
// delivery fails, the batch rolls back and runs again without it. Each other delivery then
// runs behind one savepoint, set again before each delivery, with no RELEASE. The Batcher
// keeps savepoints from the first run for a while, savepointsAfterFailure long.
//
// A delivery may fail, panic, time out or leave its savepoint unusable. It is then rolled
// back alone and its attempt is counted on its row. Process then quarantines or retries
// it. A lock conflict retries the batch whole. A lost connection falls every delivery back
// to Process. A multi-step handler's steps made in the batch commit with it, and Process
// resumes the rest. Outbox rows and Inserter rows wait in the batch's txdefer.Set, and go
// out as multi-row INSERTs at its end. An inbox.Preparer's Prepare runs before the batch, never
// inside it.

// savepointName is the one savepoint of a grouped batch, set before each delivery.
const savepointName = "onceflow_delivery"

// savepointsAfterFailure is how long a Batcher of a plain handler sets a savepoint before
// every delivery from its batches' start, after one of its deliveries failed in a batch.
// Otherwise a batch first runs without savepoints, as the comment at the top says.
const savepointsAfterFailure = 5 * time.Second

// savepointsFirst reports whether a batch should set savepoints from its first run.
func (b *Batcher) savepointsFirst() bool { return time.Now().UnixNano() < b.savepointsUntil.Load() }

// failedInBatch notes that a delivery failed in a batch, so the next batches set
// savepoints.
func (b *Batcher) failedInBatch() {
	b.savepointsUntil.Store(time.Now().Add(savepointsAfterFailure).UnixNano())
}

// failure is a delivery's failed attempt in a batch, answered after the batch.
type failure struct {
	err     error
	counted bool // already counted on the row (in the batch), total holds the count
	total   int
}

// blamedError takes one delivery out of a batch whose transaction it left unusable.
type blamedError struct {
	it  *item
	err error
}

func (e *blamedError) Error() string {
	return fmt.Sprintf("delivery %q taken out of the batch: %v", e.it.p.dec.Key, e.err)
}

func (e *blamedError) Unwrap() error { return e.err }

// handleGrouped runs a plain handler on the rows that are ours to run, sorted by key. Each
// delivery runs behind the savepoint when savepoints is set. handleGrouped brings the rows'
// status in line with what the handler finished.
//
// The whole loop runs behind one guard, so there is one goroutine per batch, not per
// delivery. handleOne recovers a panic per delivery. When the batch's time runs out, the
// delivery being handled is blamed. The loop may still be running in an abandoned Handle.
// It stops at its next delivery, because ctx is done. Until then it touches only that
// delivery, which is taken out of the batch.
func (b *Batcher) handleGrouped(ctx context.Context, tx *sql.Tx, run []*item, counts map[int][]any, savepoints bool) error {
	var cur atomic.Pointer[item] // the delivery being handled
	err := guard(ctx, "handle", func() error { return b.groupLoop(ctx, tx, run, counts, savepoints, &cur) })
	if err != nil && errors.Is(err, ErrHandlerTimeout) {
		if it := cur.Load(); it != nil {
			if _, blamed := errors.AsType[*blamedError](err); !blamed {
				return &blamedError{it: it, err: err}
			}
		}
	}
	return err
}

func (b *Batcher) groupLoop(ctx context.Context, tx *sql.Tx, run []*item, counts map[int][]any, savepoints bool, cur *atomic.Pointer[item]) error {
	var done, unfinished []any // resumed rows now done, and new rows not finished
	// Outbox rows the deliveries add wait in a txdefer.Set for the end of the batch.
	deferred := txdefer.New(tx)
	hctx := txdefer.With(ctx, deferred)
	for _, it := range run {
		if ctx.Err() != nil {
			return ctx.Err() // abandoned, or about to be, so touch nothing more
		}
		cur.Store(it)
		if b.prep != nil && !it.p.ready {
			// The delivery was not prepared, and its slow call must not be made in this
			// transaction.
			if !it.resumed {
				unfinished = append(unfinished, it.id)
			}
			continue
		}
		it.ran = true
		if savepoints {
			if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepointName); err != nil { // on PostgreSQL a new one of that name hides the last
				return fmt.Errorf("savepoint: %w", err)
			}
		}
		mark := deferred.Mark()
		dctx, span := b.startHandleOne(hctx, it) // in the delivery's trace, if the inbox traces
		prog, err := b.handleOne(dctx, it.d, tx)
		tracex.End(span, err)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				// The batch's time ran out in this Handle, so the transaction cannot be used
				// again.
				return &blamedError{it: it, err: fmt.Errorf("%w: %w", ErrHandlerTimeout, err)}
			case dbx.IsLockConflict(err) || dbx.IsConnError(err):
				// This is not the delivery's fault, and a deadlock has rolled the whole
				// transaction back. The batch is retried, or falls back, as a whole.
				return err
			case !savepoints:
				// There is no savepoint to go back to. The batch is rolled back and runs again
				// without this delivery, each delivery behind a savepoint.
				return &blamedError{it: it, err: err}
			}
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepointName); rerr != nil {
				return &blamedError{it: it, err: errors.Join(err, fmt.Errorf("rollback to savepoint: %w", rerr))}
			}
			deferred.Truncate(mark)
			total, cerr := b.countFailed(ctx, tx, it, err)
			if cerr != nil {
				return cerr
			}
			it.failed = &failure{err: err, counted: true, total: total}
			continue
		}
		if prog != inbox.Done {
			// With Continue, the steps it made commit with the batch, and the rest run one
			// at a time.
			if !it.resumed {
				unfinished = append(unfinished, it.id)
			}
			continue
		}
		if it.resumed {
			done = append(done, it.id)
		}
		it.finish(Result{Outcome: OutcomeProcessed, InboxID: it.id, Key: it.p.dec.Key})
		if len(it.copies) > 0 {
			counts[len(it.copies)] = append(counts[len(it.copies)], it.id)
		}
	}
	cur.Store(nil)
	if err := deferred.Flush(ctx); err != nil {
		// No one delivery can be blamed, as for a duplicate event id. The batch falls back,
		// and each delivery's Add writes at once and sees its own error.
		return fmt.Errorf("write the batch's deferred rows: %w", err)
	}
	return b.markRows(ctx, tx, done, unfinished)
}

// handleOne runs one delivery's Handle in tx, on the caller's goroutine. With StepsPerTx
// above 1 it runs the delivery's next steps too. A panic comes back as a *PanicError, and
// an invalid Progress as an error.
func (b *Batcher) handleOne(ctx context.Context, d *inbox.Delivery, tx *sql.Tx) (prog inbox.Progress, err error) {
	defer func() {
		if perr := recovered(recover()); perr != nil {
			prog, err = 0, perr
		}
	}()
	cfg := b.ib.cfg
	prog, err = b.ib.h.Handle(ctx, tx, d)
	for step := 0; err == nil && prog == inbox.Continue && step+1 < cfg.StepsPerTx && step+1 < cfg.MaxSteps; {
		step++
		d.Step = step
		prog, err = b.ib.h.Handle(ctx, tx, d)
	}
	if err == nil && !validProgress(prog) {
		err = invalidProgress(prog)
	}
	return prog, err
}

// countFailed records a failed attempt on the delivery's row in the batch's transaction.
// It returns the attempts the row has now failed. The claim of a new row wrote it with one
// attempt, and a resumed row gets one more.
func (b *Batcher) countFailed(ctx context.Context, tx *sql.Tx, it *item, cause error) (int, error) {
	more := 0
	if it.resumed {
		more = 1
	}
	if b.q.d.IsPostgres() {
		var n int
		if err := tx.QueryRowContext(ctx, b.q.failed, more, errorText(cause), it.id).Scan(&n); err != nil {
			return 0, fmt.Errorf("count the failed attempt of inbox row %d: %w", it.id, err)
		}
		return n, nil
	}
	r, err := tx.ExecContext(ctx, b.q.failed, more, errorText(cause), it.id)
	if err != nil {
		return 0, fmt.Errorf("count the failed attempt of inbox row %d: %w", it.id, err)
	}
	n, err := r.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("count the failed attempt of inbox row %d: %w", it.id, err)
	}
	return int(n), nil
}

// answerBlamed answers the deliveries taken out of a batch, after it committed or fell
// back. Each is counted in its own transaction, then retried or quarantined alone. Their
// copies run one at a time.
func (b *Batcher) answerBlamed(blamed []*blamedError) {
	for _, bl := range blamed {
		b.ib.logger.Info("delivery taken out of its batch", watermill.LogFields{b.ib.cfg.KeyLogField: bl.it.p.dec.Key, "err": validText(bl.err.Error(), 1000)})
		fallBack(bl.it.copies)
		bl.it.p.answer(batchOutcome{failed: &failure{err: bl.err}})
		b.count(func(s *BatchStats) { s.Isolated++; s.Fallbacks += int64(len(bl.it.copies)) })
	}
}

// afterFailure ends a delivery whose attempt failed in a batch or before it. The attempt
// is counted on its row if it was not yet. The delivery is quarantined when its failure is
// permanent, a refusal of its data included, or its attempts are used up. Otherwise
// Process retries it after its backoff. afterFailure returns what Process would.
func (b *Batcher) afterFailure(ctx context.Context, p *pending, f *failure) (Result, error) {
	ib := b.ib
	if ctx.Err() != nil {
		return Result{}, ctx.Err()
	}
	total := f.total
	if !f.counted {
		total = ib.countFailure(ctx, p.msg, p.src, p.dec, f.err, 1, runOpts{})
	}
	fields := watermill.LogFields{"topic": p.src.Topic, "partition": p.src.Partition, "offset": p.src.Offset, ib.cfg.KeyLogField: p.dec.Key, "attempts": total}
	reason := failureReason(f.err)
	switch {
	case reason == ReasonRetriesExhausted && isPermanent(f.err):
		reason = ReasonPermanent
	case reason == ReasonData: // the database refused its values: no retry differs
	case total >= ib.cfg.MaxAttempts:
	default:
		ib.logger.Info("handler failed in a batch, will retry alone", fields.Add(watermill.LogFields{"err": validText(f.err.Error(), 1000)}))
		sleep(ctx, ib.cfg.backoff(total))
		opts := ib.liveOptions()
		opts.failed = total
		opts.carry = p.carried() // its Handle rolled back alone: its calls stand
		return ib.run(ctx, p.msg, p.src, opts)
	}
	var res Result
	var err error
	if reason == ReasonPermanent || reason == ReasonData {
		res, err = ib.quarantine(ctx, p.msg, p.src, p.dec.Key, p.dec.Fingerprint, reason, f.err, total, runOpts{})
		if err == nil {
			msg := "handler failed, message quarantined"
			if reason == ReasonData {
				msg = "the database refused the delivery's data, message quarantined"
			}
			ib.logger.Error(msg, f.err, fields.Add(watermill.LogFields{"reason": string(reason)}))
		}
	} else {
		res, err = ib.giveUp(ctx, p.msg, p.src, p.dec, reason, f.err, total, runOpts{}) // delayed or quarantined
	}
	if err != nil {
		return res, err
	}
	ib.obs.Delivered(ib.cfg.BizType, res, time.Since(p.start))
	return res, nil
}

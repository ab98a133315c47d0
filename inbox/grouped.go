package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Group commit for plain handlers. A Batcher whose handler is not a BatchHandler claims a
// batch's inbox rows as it does for one (one multi-row claim, duplicates and conflicts
// sorted out from what it returns), then runs the handler's Handle for each delivery that
// is ours to run, one after another in the batch's transaction, each behind a savepoint:
//
//	SAVEPOINT onceflow_delivery        -- one round trip per delivery
//	Handle(ctx, tx, d)                 -- the plugin's own statements
//	[ROLLBACK TO SAVEPOINT onceflow_delivery; count the failed attempt on its row]
//
// The savepoint has one name, set again before each delivery: setting a savepoint that
// exists replaces it, so no RELEASE SAVEPOINT is sent (a round trip per delivery less);
// the last one goes with the commit.
//
// A delivery whose Handle returns an error, panics or returns an invalid Progress is rolled
// back to its savepoint alone: its row is set back to 'processing' with the attempt counted
// on it (attempts, last_error — as countFailure does on the one-at-a-time path), the batch
// goes on, and once it has committed the delivery is quarantined (Permanent, or attempts
// used up: ReasonPermanent, ReasonPanic, ReasonRetriesExhausted) or retried alone by
// Process after its backoff. What is not the delivery's fault fails the whole batch as
// with a BatchHandler: a lock conflict (InnoDB rolls back the whole transaction on a
// deadlock) is retried whole, a lost connection falls every delivery back. A Handle that
// does not return within inbox.handler_timeout (counted from the batch's start), or whose
// failure leaves the savepoint unusable, is taken out of the batch: its attempt is counted
// in a transaction of its own (countFailure), and the others run once more without it in a
// new transaction; should that happen again, they all fall back.
//
// Multi-step handlers: a delivery's Handle runs its first step in the batch and, with
// inbox.steps_per_transaction above 1, the next ones too, inside its savepoint (exactly the
// steps runStep would put in one transaction). When it still returns Continue, the steps it
// made commit with the batch (its row 'processing') and the one-at-a-time path resumes it
// after the batch, its own state deciding what is left — as it does for a BatchHandler's
// Continue.
//
// A plain Preparer's Prepare runs before the batch, outside any transaction (prepare.go);
// a delivery that is not prepared (its Prepare failed, or was skipped for a key just
// finished) never runs Handle in a batch, so no slow call is made inside one.

// savepointName is the one savepoint of a grouped batch, set before each delivery.
const savepointName = "onceflow_delivery"

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

// handleGrouped runs a plain handler on the rows that are ours to run (sorted by key), each
// delivery behind the savepoint, and brings the rows' status in line with what it finished.
func (b *Batcher) handleGrouped(ctx context.Context, tx *sql.Tx, run []*item, counts map[int][]any) error {
	var done, unfinished []any // resumed rows now done; new rows not finished
	for _, it := range run {
		if b.prep != nil && !it.p.ready {
			// Not prepared: its slow call must not be made in this transaction.
			if !it.resumed {
				unfinished = append(unfinished, it.id)
			}
			continue
		}
		if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepointName); err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		prog, err := b.handleOne(ctx, it.d, tx)
		if err != nil {
			switch {
			case ctx.Err() != nil || errors.Is(err, ErrHandlerTimeout):
				// The batch's time ran out in this Handle (which may still be running: the
				// transaction cannot be used again).
				if !errors.Is(err, ErrHandlerTimeout) {
					err = fmt.Errorf("%w: %w", ErrHandlerTimeout, err)
				}
				return &blamedError{it: it, err: err}
			case dbx.IsLockConflict(err) || dbx.IsConnError(err):
				// Not the delivery's fault, and a deadlock has rolled the whole transaction
				// back: the batch is retried (or falls back) as a whole.
				return err
			}
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepointName); rerr != nil {
				return &blamedError{it: it, err: errors.Join(err, fmt.Errorf("rollback to savepoint: %w", rerr))}
			}
			total, cerr := b.countFailed(ctx, tx, it, err)
			if cerr != nil {
				return cerr
			}
			it.failed = &failure{err: err, counted: true, total: total}
			continue
		}
		if prog != Done {
			// Continue: the steps it made commit with the batch; the rest one at a time.
			if !it.resumed {
				unfinished = append(unfinished, it.id)
			}
			continue
		}
		if it.resumed {
			done = append(done, it.id)
		}
		it.res = &Result{Outcome: OutcomeProcessed, InboxID: it.id, Key: it.p.dec.Key}
		if len(it.copies) > 0 {
			counts[len(it.copies)] = append(counts[len(it.copies)], it.id)
		}
	}
	return b.markRows(ctx, tx, done, unfinished)
}

// handleOne runs one delivery's Handle (and, with StepsPerTx > 1, its next steps) in tx
// behind guard. An invalid Progress is an error.
func (b *Batcher) handleOne(ctx context.Context, d *Delivery, tx *sql.Tx) (Progress, error) {
	cfg := b.ib.cfg
	var prog Progress
	err := guard(ctx, "handle", func() error {
		var err error
		prog, err = b.ib.h.Handle(ctx, tx, d)
		for step := 0; err == nil && prog == Continue && step+1 < cfg.StepsPerTx && step+1 < cfg.MaxSteps; {
			step++
			d.Step = step
			prog, err = b.ib.h.Handle(ctx, tx, d)
		}
		if err == nil && !prog.valid() {
			err = invalidProgress(prog)
		}
		return err
	})
	return prog, err
}

// countFailed records a failed attempt on the delivery's row in the batch's transaction
// and returns the attempts the row has now failed: the claim of a new row wrote it with
// one attempt, a resumed row gets one more.
func (b *Batcher) countFailed(ctx context.Context, tx *sql.Tx, it *item, cause error) (int, error) {
	more := 0
	if it.resumed {
		more = 1
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

// answerBlamed answers the deliveries taken out of a batch (after it committed or fell
// back): each is counted in its own transaction, then retried or quarantined alone; their
// copies run one at a time.
func (b *Batcher) answerBlamed(blamed []*blamedError) {
	for _, bl := range blamed {
		b.ib.logger.Info("delivery taken out of its batch", watermill.LogFields{b.ib.cfg.KeyLogField: bl.it.p.dec.Key, "err": validText(bl.err.Error(), 1000)})
		fallBack(bl.it.copies)
		bl.it.p.done <- batchOutcome{failed: &failure{err: bl.err}}
		b.count(func(s *BatchStats) { s.Isolated++; s.Fallbacks += int64(len(bl.it.copies)) })
	}
}

// afterFailure ends a delivery whose attempt failed in (or before) a batch: counted on its
// row if it was not yet, then quarantined when it is permanent or its attempts are used
// up, else retried by Process after its backoff. It returns what Process would.
func (b *Batcher) afterFailure(ctx context.Context, p *pending, f *failure) (Result, error) {
	ib := b.ib
	if ctx.Err() != nil {
		return Result{}, ctx.Err()
	}
	total := f.total
	if !f.counted {
		total = ib.countFailure(ctx, p.msg, p.src, p.dec, f.err, 1, ProcessOptions{})
	}
	fields := watermill.LogFields{"topic": p.src.Topic, "partition": p.src.Partition, "offset": p.src.Offset, ib.cfg.KeyLogField: p.dec.Key, "attempts": total}
	reason := failureReason(f.err)
	switch {
	case reason == ReasonRetriesExhausted && errors.Is(f.err, ErrPermanent):
		reason = ReasonPermanent
	case total >= ib.cfg.MaxAttempts:
	default:
		ib.logger.Info("handler failed in a batch, will retry alone", fields.Add(watermill.LogFields{"err": validText(f.err.Error(), 1000)}))
		sleep(ctx, ib.cfg.backoff(total))
		return ib.Process(ctx, p.msg, p.src, ProcessOptions{failed: total})
	}
	res, err := ib.quarantine(ctx, p.msg, p.src, p.dec.Key, p.dec.Fingerprint, reason, f.err, total, ProcessOptions{})
	if err != nil {
		return res, err
	}
	ib.logger.Error("handler failed, message quarantined", f.err, fields.Add(watermill.LogFields{"reason": string(reason)}))
	ib.obs.Delivered(ib.cfg.BizType, res, time.Since(p.start))
	return res, nil
}

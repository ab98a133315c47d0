package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// ReasonDelayed marks a 'failed' row that is not quarantined. It waits for a delayed
// redelivery at its retry_at, as Config.DelayedRetries describes. Later deliveries of its
// key are held meanwhile, as for a quarantined row.
const ReasonDelayed Reason = "delayed"

// OutcomeDelayed means the delivery's attempts ran out with a retryable failure, and its
// row waits for a delayed redelivery. The message is acked.
const OutcomeDelayed Outcome = "delayed"

// Delayable reports whether a failure of reason is retried later by a delayed redelivery,
// rather than quarantined once the immediate attempts run out. A handler error and a
// timeout are, because a dependency that is down produces them. A panic is the plugin's
// bug. Poison, a conflict and values the database refuses with ReasonData are the
// message's fault. inbox.ErrPermanent is the handler's verdict. None of them changes in a few
// minutes. A panic is quarantined when its attempts run out, and the others at their first
// failure.
func Delayable(reason Reason) bool {
	return reason == ReasonRetriesExhausted || reason == ReasonTimeout
}

// giveUp ends a delivery whose attempts ran out. The delivery is delayed when reason is
// Delayable and delayed rounds remain on its row. Otherwise it is quarantined with reason.
func (ib *Inbox) giveUp(ctx context.Context, msg *message.Message, src inbox.Source, dec decoded, reason Reason, cause error, attempts int, opts runOpts) (Result, error) {
	fields := watermill.LogFields{"topic": src.Topic, "partition": src.Partition, "offset": src.Offset, ib.cfg.KeyLogField: dec.Key, "attempts": attempts}
	if ib.cfg.DelayedRetries > 0 && Delayable(reason) && !opts.command && ib.replyQuery == "" {
		res, delayed, err := ib.delay(ctx, dec, reason, cause, attempts, opts)
		if err != nil {
			return Result{}, err
		}
		if delayed {
			ib.logger.Info("attempts used up, delivery delayed", fields.Add(watermill.LogFields{"reason": string(reason), "round": res.Attempts, "err": validText(cause.Error(), 1000)}))
			res.Attempts = attempts
			return res, nil
		}
	}
	msgText := "retries exhausted, message quarantined"
	if reason != ReasonRetriesExhausted {
		msgText = "plugin failed on every attempt, message quarantined"
	}
	ib.logger.Error(msgText, cause, fields.Add(watermill.LogFields{"reason": string(reason)}))
	return ib.quarantine(ctx, msg, src, dec.Key, dec.Fingerprint, reason, cause, attempts, opts)
}

// delay stores the delivery's row as waiting for a delayed redelivery when it has rounds
// left. It returns delayed false, having changed nothing, when the row has none. It does
// the same when there is no row the attempts were counted on, and quarantine then writes
// the whole row. The row is locked, so two processes that exhaust their attempts together
// count one round each, never beyond the limit. The result's Attempts holds the round.
func (ib *Inbox) delay(ctx context.Context, dec decoded, reason Reason, cause error, attempts int, opts runOpts) (res Result, delayed bool, err error) {
	for try := 0; ; try++ {
		res, delayed = Result{}, false
		err = dbx.InTx(ctx, ib.db, func(tx *sql.Tx) error {
			var id int64
			var status Status
			var rounds int
			err := tx.QueryRowContext(ctx, ib.q.delayLock, dec.Key, ib.cfg.BizType).Scan(&id, &status, &rounds)
			if errors.Is(err, sql.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			if status == StatusDone || rounds >= ib.cfg.DelayedRetries {
				return nil
			}
			at := time.Now().Add(ib.cfg.delayedBackoff(rounds)).UTC()
			if _, err := tx.ExecContext(ctx, ib.q.delay, at, attempts, errorText(cause), nullID(opts.ReplayID), id); err != nil {
				return err
			}
			res = Result{Outcome: OutcomeDelayed, InboxID: id, Key: dec.Key, Reason: ReasonDelayed, Attempts: rounds + 1, Err: cause}
			delayed = true
			return nil
		})
		if err == nil || !dbx.IsLockConflict(err) || try >= ib.cfg.MaxLockRetries {
			break
		}
		sleep(ctx, 10*time.Millisecond)
	}
	if err != nil {
		return Result{}, false, fmt.Errorf("delay %q (%s): %w", dec.Key, reason, err)
	}
	if delayed {
		select {
		case ib.delayed <- struct{}{}: // the redeliverer looks at it from now on
		default:
		}
	}
	return res, delayed, nil
}

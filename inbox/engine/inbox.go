package engine

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Status of an inbox row.
type Status string

const (
	StatusProcessing Status = "processing"
	StatusDone       Status = "done"
	StatusFailed     Status = "failed"
)

// Reason says why a row is 'failed'.
type Reason string

const (
	ReasonPoison           Reason = "poison"
	ReasonConflict         Reason = "conflict"
	ReasonRetriesExhausted Reason = "retries_exhausted"
	ReasonPermanent        Reason = "permanent"
	ReasonPanic            Reason = "panic"   // the plugin panicked on every attempt, and last_error holds the stack
	ReasonTimeout          Reason = "timeout" // the plugin did not return within inbox.handler_timeout on every attempt
)

// ReasonResolved is the reason of a row an operator resolved with `router inbox resolve`.
// It marks a quarantined row whose key needs nothing more, because its cause was dealt with
// otherwise. For example, a corrected record was processed under its own key. The row is
// 'done'. It no longer counts as failed, and a later delivery of its key is a duplicate. It
// has no effect of its own. So a plugin's Verify leaves it out when it checks that every
// done row has its effect.
const ReasonResolved Reason = "resolved"

// Outcome of one delivery.
type Outcome string

const (
	OutcomeProcessed   Outcome = "processed"
	OutcomeDuplicate   Outcome = "duplicate"
	OutcomeQuarantined Outcome = "quarantined"
	OutcomeConflict    Outcome = "conflict"
	// OutcomeHeld means the key's row is quarantined as 'failed', so this delivery is not
	// run. It is counted in the row's duplicates, and the key stays held until a replay
	// releases it.
	OutcomeHeld Outcome = "held"
	// OutcomeRefused is a replay's outcome, never a delivery's. The row holds less than the
	// message as delivered, as inboxops.Row.Replayable reports. So it was not run and is
	// left as it is.
	OutcomeRefused Outcome = "refused"
)

// Result describes what Process did.
type Result struct {
	Outcome  Outcome
	InboxID  int64
	Key      string
	Reason   Reason // for quarantined, conflict and held outcomes
	Attempts int
	Err      error // the error that caused a quarantine, or why a replay refused the row

	reply *Reply // a command's response, for RunCommand
}

// Observer receives one call per finished delivery, such as for metrics. Implementations
// must be safe for concurrent use.
type Observer interface {
	Delivered(bizType string, r Result, elapsed time.Duration)
}

type nopObserver struct{}

func (nopObserver) Delivered(string, Result, time.Duration) {}

// Inbox runs one inbox.Handler behind the inbox table.
type Inbox struct {
	db     *sql.DB
	h      inbox.Handler
	cfg    Config
	logger watermill.LoggerAdapter
	obs    Observer
	d      dbx.Dialect // the pool's
	q      queries
	calls  chan struct{} // one slot per Prepare running, MaxInFlightCalls of them
	tr     trace.Tracer  // from Config.TracerProvider, or nil for no tracing
	br     *breaker      // nil for no circuit breaker, with Config.BreakerOff or in a command's inbox
	leases *callLeases   // the keys' call leases, taken before a Preparer's calls, in calls.go
	// delayed ends the redeliverer's idle backoff: delay sends on it, without blocking, once
	// it has stored a row waiting for a delayed redelivery.
	delayed chan struct{}
	looks   atomic.Int64 // the redeliverer's looks for due rows, for RedeliveryLooks
	// replyQuery reads a command's stored response and replySave stores responses. NewCommand
	// sets them, and they are empty for a Kafka inbox.
	replyQuery, replySave string
}

// New builds an Inbox. A nil logger logs nothing, and a nil observer records nothing.
func New(db *sql.DB, h inbox.Handler, cfg Config, logger watermill.LoggerAdapter, obs Observer) (*Inbox, error) {
	if db == nil || h == nil {
		return nil, errors.New("inbox: db and handler are required")
	}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	if obs == nil {
		obs = nopObserver{}
	}
	d := dbx.DialectOf(db)
	ib := &Inbox{db: db, h: h, cfg: cfg, logger: logger.With(watermill.LogFields{"biz_type": cfg.BizType}), obs: obs, d: d, q: newQueries(cfg.Table, d),
		calls: make(chan struct{}, cfg.MaxInFlightCalls), tr: tracex.Tracer(cfg.TracerProvider, tracerScope), delayed: make(chan struct{}, 1)}
	ib.br = newBreaker(cfg, ib.breakerChanged)
	ib.leases = newCallLeases(ib)
	return ib, nil
}

// BizType returns the biz type this inbox deduplicates for.
func (ib *Inbox) BizType() string { return ib.cfg.BizType }

// Config returns the resolved configuration.
func (ib *Inbox) Config() Config { return ib.cfg }

// DB returns the inbox's pool.
func (ib *Inbox) DB() *sql.DB { return ib.db }

// Decode checks msg against the inbox's bounds and runs the handler's Decode, as a delivery
// of msg would, writing nothing. An error means the delivery would be quarantined as
// poison. The error wraps inbox.ErrPoison, and a panic in Decode is a *PanicError.
func (ib *Inbox) Decode(msg *message.Message) (inbox.Decoded, error) {
	dec, err := ib.decode(msg)
	return dec.Decoded, err
}

// ProcessOptions change how Process treats an existing row. Live deliveries use the zero
// value.
type ProcessOptions struct {
	// ReplayID stamps the row with the replay that ran it.
	ReplayID int64
	// Reopen lets a 'failed' row run again, as a replay does after its cause was fixed.
	Reopen bool
}

// runOpts is how one delivery runs. It holds the caller's options and the inbox's own.
type runOpts struct {
	ProcessOptions
	failed int // attempts already made and counted, for a Batcher's delivery that failed in its batch
	// command marks an HTTP command's request, run by RunCommand. A Decode error is the
	// client's, an error wrapping ErrBadRequest with nothing written. So is a conflict,
	// which is reported, not quarantined.
	command bool
	// redelivery marks a delayed redelivery of the row's stored message, by Redeliver. It
	// reopens only a row still waiting for one.
	redelivery bool
	// carry holds what a Prepare made for a step whose transaction did not commit. The
	// delivery's next attempt of that step uses it. When it is nil, process makes one.
	carry *carried
	// notes begin the last error of a poison row. They hold the record's Kafka key and the
	// payload's id, which its dedup key does not. See msgsource.Notes.
	notes string
}

// carried is what a delivery's Prepare left in Delivery.Prepared for a step whose
// transaction then rolled back. The step's next attempt reuses it rather than calling out
// again. The calls were made, and nothing of the key moved since, because the path holds
// its call lease. Handle checks it again, as it checks any Prepared.
type carried struct {
	step  int
	value any
	ok    bool
}

// Process runs one delivery to its end. The outcome is processed, duplicate, held,
// conflict or quarantined. Process returns an error only when the outcome could not be
// recorded, because the database was unreachable or the context was cancelled. The caller
// must then NOT ack the message, so that it is redelivered. The error wraps
// ErrOutcomeUnknown when some of the delivery's work committed, or may have, before the
// error. That happens after a commit that got no answer, or when a step committed before
// the next one failed.
func (ib *Inbox) Process(ctx context.Context, msg *message.Message, src inbox.Source, opts ProcessOptions) (Result, error) {
	return ib.run(ctx, msg, src, runOpts{ProcessOptions: opts})
}

// run is Process with the inbox's own options.
func (ib *Inbox) run(ctx context.Context, msg *message.Message, src inbox.Source, opts runOpts) (Result, error) {
	if ib.tr != nil && ctx.Value(tracedKey{}) != msg {
		return ib.processTraced(ctx, msg, src, opts) // this again, under the delivery's span
	}
	start := time.Now()
	res, err := ib.process(ctx, msg, src, opts)
	if err == nil {
		ib.obs.Delivered(ib.cfg.BizType, res, time.Since(start))
	}
	return res, err
}

func (ib *Inbox) process(ctx context.Context, msg *message.Message, src inbox.Source, opts runOpts) (_ Result, err error) {
	uncertain := false // an attempt committed some of the work, or may have
	defer func() {
		if err != nil && uncertain {
			err = outcomeUnknown(err)
		}
	}()
	fields := watermill.LogFields{"topic": src.Topic, "partition": src.Partition, "offset": src.Offset, "message_uuid": validText(msg.UUID, maxUUIDBytes)}
	dec, derr := ib.decode(msg)
	if derr != nil && opts.command {
		return Result{}, fmt.Errorf("%w: %w", ErrBadRequest, derr) // not reached, because runCommand decoded it first
	}
	if derr != nil {
		key := poisonKey(src, msg)
		reason := ReasonPoison
		if failureReason(derr) == ReasonPanic {
			reason = ReasonPanic // the plugin's decoder panicked on these bytes, and no retry will differ
		}
		opts.notes = ib.poisonNotes(msg)
		r, err := ib.quarantine(ctx, msg, src, key, payloadFingerprint(msg), reason, derr, 0, opts)
		if err == nil {
			ib.logger.Error("poison message quarantined", derr, fields.Add(watermill.LogFields{ib.cfg.KeyLogField: key, "reason": string(reason)}))
		}
		return r, err
	}
	fields = fields.Add(watermill.LogFields{ib.cfg.KeyLogField: dec.Key})

	lockRetries := 0
	var d *inbox.Delivery
	if opts.carry == nil {
		opts.carry = &carried{}
	}
	for attempt := 1 + opts.failed; ; {
		// Each attempt gets a fresh Delivery, because plugin code abandoned by a timeout may
		// still hold the previous one.
		d = &inbox.Delivery{Message: msg, BizType: ib.cfg.BizType, Key: dec.Key, Value: dec.Value, Source: src, ReplayID: opts.ReplayID, Attempt: attempt}
		if ib.tr != nil {
			setTrace(d, trace.SpanContextFromContext(ctx))
		}
		// An open breaker holds the attempt back until a probe may run, and no attempt is
		// spent. A delivery that failed before probes only when no first attempt waits.
		t, err := ib.br.admit(ctx, attempt > 1 || opts.redelivery)
		if err != nil {
			return Result{}, fmt.Errorf("inbox %s %q: waiting on the circuit breaker: %w", ib.cfg.BizType, dec.Key, err)
		}
		attemptUncertain := false // a transaction of this attempt committed some of the work, or may have
		res, err := ib.runSteps(ctx, d, &attemptUncertain, dec, opts)
		switch {
		case err == nil && res.Outcome == OutcomeProcessed:
			t.done(verdictSuccess)
		case err == nil:
			t.done(verdictNone)
		default:
			t.failed(deliveryVerdict(attemptVerdict(ctx, err), attempt), err)
		}
		if err == nil {
			res.Attempts = attempt
			return res, nil
		}
		uncertain = uncertain || attemptUncertain
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("inbox %s %q: %w", ib.cfg.BizType, dec.Key, errors.Join(ctx.Err(), err))
		}
		reason := failureReason(err)
		switch {
		case reason == ReasonData:
			// The database refused the delivery's values. Every attempt would meet the same
			// refusal, so none is retried or delayed.
			ib.logger.Error("the database refused the delivery's data, message quarantined", err, fields.Add(watermill.LogFields{"reason": string(reason), "attempt": attempt}))
			return ib.quarantine(ctx, msg, src, dec.Key, dec.Fingerprint, ReasonData, err, attempt, opts)
		case reason != ReasonRetriesExhausted:
			// A panic or a timeout is the plugin's failure, whatever error it left behind. A
			// cancelled query can look like a broken connection. It counts as an attempt.
			if total := ib.countFailure(ctx, msg, src, dec, err, attempt, opts); total >= ib.cfg.MaxAttempts {
				return ib.giveUp(ctx, msg, src, dec, reason, err, total, opts)
			}
		case errors.Is(err, errLeaseLost) || errors.Is(err, errRowMoved):
			// Another path took the key's call lease, or changed its row. That is not the
			// handler's fault. The delivery runs again once it holds the lease, on the row as
			// it was left.
			sleep(ctx, time.Duration(1+rand.IntN(20))*time.Millisecond)
			continue
		case dbx.IsLockConflict(err) && lockRetries < ib.cfg.MaxLockRetries:
			// The server rolled us back to break a deadlock or a long wait, which is not the
			// handler's fault.
			lockRetries++
			sleep(ctx, time.Duration(1+rand.IntN(20))*time.Millisecond)
			continue
		case dbx.IsConnError(err):
			// The database is unreachable. Nothing can be recorded, so do not burn attempts.
			ib.logger.Error("database unreachable, retrying", err, fields)
			sleep(ctx, ib.cfg.BackoffMax)
			continue
		case isPermanent(err):
			return ib.quarantine(ctx, msg, src, dec.Key, dec.Fingerprint, ReasonPermanent, err, attempt, opts)
		default:
			if total := ib.countFailure(ctx, msg, src, dec, err, attempt, opts); total >= ib.cfg.MaxAttempts {
				return ib.giveUp(ctx, msg, src, dec, ReasonRetriesExhausted, err, total, opts)
			}
		}
		ib.logger.Info("handler failed, will retry", fields.Add(watermill.LogFields{"attempt": attempt, "err": validText(err.Error(), 1000)}))
		sleep(ctx, ib.cfg.backoff(attempt))
		attempt++
	}
}

// decode checks the record against the inbox's bounds and runs the plugin's Decode. Every
// error it returns makes the message poison. A panic in Decode comes back as a *PanicError
// wrapped in inbox.ErrPoison.
func (ib *Inbox) decode(msg *message.Message) (dec decoded, err error) {
	if cut, ok := msgsource.CutFrom(msg.Context()); ok {
		return decoded{}, inbox.PoisonError("payload of %d bytes exceeds the limit of %d", cut.Size, ib.cfg.MaxPayloadBytes)
	}
	if len(msg.Payload) > ib.cfg.MaxPayloadBytes {
		return decoded{}, inbox.PoisonError("payload of %d bytes exceeds the limit of %d", len(msg.Payload), ib.cfg.MaxPayloadBytes)
	}
	meta, ok := metadataJSON(msg.Metadata, ib.cfg.MaxMetadataBytes)
	if !ok {
		return decoded{}, inbox.PoisonError("metadata (headers) of %d entries exceed the limit of %d bytes", len(msg.Metadata), ib.cfg.MaxMetadataBytes)
	}
	defer func() {
		if perr := recovered(recover()); perr != nil {
			dec, err = decoded{}, fmt.Errorf("%w: decode: %w", inbox.ErrPoison, perr)
		}
	}()
	dec.Decoded, err = ib.h.Decode(msg)
	if err != nil {
		if !errors.Is(err, inbox.ErrPoison) {
			err = fmt.Errorf("%w: %w", inbox.ErrPoison, err)
		}
		return decoded{}, err
	}
	if ib.replyQuery != "" {
		dec.Key = CommandKey(msg.Metadata.Get(inbox.MetadataIdempotencyKey)) // a command's key is its client token
	}
	switch {
	case dec.Key == "":
		return decoded{}, inbox.PoisonError("empty business key")
	case len(dec.Key) > inbox.MaxKeyLen:
		return decoded{}, inbox.PoisonError("business key of %d bytes exceeds %d", len(dec.Key), inbox.MaxKeyLen)
	case !utf8.ValidString(dec.Key):
		return decoded{}, inbox.PoisonError("business key %q is not UTF-8", dec.Key)
	case ib.d.IsPostgres() && strings.IndexByte(dec.Key, 0) >= 0:
		return decoded{}, inbox.PoisonError("business key %q holds a NUL byte, which PostgreSQL text cannot store", dec.Key)
	}
	if dec.Fingerprint == "" {
		dec.Fingerprint = fingerprint(msg.Payload)
	}
	dec.Fingerprint = storableFingerprint(dec.Fingerprint)
	dec.meta = meta
	return dec, nil
}

// runSteps runs the handler, one transaction per step, until it reports Done. Each step
// runs its Prepare and its transaction under inbox.handler_timeout. An inbox.Preparer's
// steps run under the key's call lease, described in calls.go. A row that is done,
// quarantined or another message's makes no calls.
//
// runSteps sets *uncertain once a transaction of the attempt committed some of the
// delivery's work, or may have when its commit got no answer. An error after it leaves
// the outcome open.
func (ib *Inbox) runSteps(ctx context.Context, d *inbox.Delivery, uncertain *bool, dec decoded, opts runOpts) (Result, error) {
	prep, _ := ib.h.(inbox.Preparer)
	var hold *callHold
	noCalls := false
	if prep != nil {
		h, row, found, err := ib.leases.Take(ctx, d.Key)
		if err != nil {
			return Result{}, err
		}
		defer h.End()
		hold = h
		if !mayCall(found, row, dec, opts) {
			prep, noCalls = nil, true
		}
	}
	for step := 0; step < ib.cfg.MaxSteps; step++ {
		res, next, err := ib.runStep(ctx, prep, hold, noCalls, d, uncertain, dec, opts, step)
		if err != nil || res != nil {
			if res != nil && res.Outcome == OutcomeConflict && !opts.command {
				return ib.quarantineConflict(ctx, d, dec, opts)
			}
			if res != nil {
				return *res, nil
			}
			return Result{}, err
		}
		step = next
	}
	return Result{}, fmt.Errorf("handler did not finish %q within %d steps", d.Key, ib.cfg.MaxSteps)
}

// runStep runs step first in one transaction. With StepsPerTx above 1, the steps after it
// join the transaction. runStep returns the delivery's result once it is finished, else the
// last step it ran. hold is the key's call lease, nil without an inbox.Preparer. noCalls
// says the path skipped the calls because of the row it read under the lease.
func (ib *Inbox) runStep(ctx context.Context, prep inbox.Preparer, hold *callHold, noCalls bool, d *inbox.Delivery, uncertain *bool, dec decoded, opts runOpts, first int) (*Result, int, error) {
	sctx, cancel := context.WithTimeout(withDialect(ctx, ib.d), ib.cfg.HandlerTimeout)
	defer cancel()
	d.Step = first
	if c := opts.carry; prep != nil && c != nil && c.ok && c.step == first {
		d.Prepared = c.value // made by an attempt whose transaction rolled back
		prep = nil
	}
	if prep != nil {
		d.Prepared = nil
		select {
		case ib.calls <- struct{}{}:
		case <-sctx.Done():
			return nil, first, stepError(ctx, sctx, timeoutError(sctx, "prepare: waiting for a call slot"))
		}
		pctx, span := ib.startSpan(sctx, "inbox prepare")
		hold.Begin() // the key stays held until this call returns, even if it is abandoned
		err := guard(pctx, "prepare", func() error {
			defer hold.CallEnded()
			return prep.Prepare(pctx, d)
		})
		tracex.End(span, err)
		<-ib.calls
		if err != nil {
			return nil, first, stepError(ctx, sctx, err)
		}
		if c := opts.carry; c != nil {
			c.step, c.value, c.ok = first, d.Prepared, true
		}
	}
	var res *Result
	step := first
	tctx, txSpan := ib.startSpan(sctx, "inbox transaction")
	body, endCommit := ib.committing(tctx, func(tx *sql.Tx) error {
		step = first // a retried closure must not keep the previous try's count
		cctx, span := ib.startSpan(tctx, "inbox claim")
		row, fresh, err := ib.claim(cctx, tx, d, dec, step)
		tracex.End(span, err)
		if err != nil {
			return err
		}
		d.InboxID = row.id
		// A later step finds its own row, so only a delivery's first step checks the
		// fingerprint. A replay runs the row's own payload again. A redelivery runs the
		// row's own message, as a replay does. It reopens only a row still waiting for it,
		// not one that an operator's replay quarantined again meanwhile.
		reopen := opts.Reopen && (!opts.redelivery || Reason(row.reason.String) == ReasonDelayed)
		decision := decideClaim(fresh, row, dec.Fingerprint, step == 0 && opts.ReplayID == 0 && !opts.redelivery, reopen)
		if noCalls && (decision == claimRun || decision == claimResume) {
			return errRowMoved // the calls were skipped for a row that is no longer as read
		}
		switch decision {
		case claimConflict:
			res = &Result{Outcome: OutcomeConflict, InboxID: row.id, Key: d.Key, Reason: ReasonConflict}
			return nil
		case claimDuplicate:
			if _, err := tx.ExecContext(sctx, ib.q.countDuplicate, row.id); err != nil {
				return fmt.Errorf("count duplicate: %w", err)
			}
			res = &Result{Outcome: OutcomeDuplicate, InboxID: row.id, Key: d.Key}
			if row.status == StatusFailed {
				res.Outcome, res.Reason = OutcomeHeld, Reason(row.reason.String)
			}
			return nil
		case claimResume:
			if step == 0 {
				d.Resumed = row.status == StatusProcessing
				if _, err := tx.ExecContext(sctx, ib.q.reopen, nullID(opts.ReplayID), row.id); err != nil {
					return fmt.Errorf("reopen inbox row: %w", err)
				}
				if err := ib.stamp(sctx, tx, opts.ReplayID, row.id); err != nil {
					return err
				}
			}
		}
		var prog inbox.Progress
		err = guard(sctx, "handle", func() error {
			var err error
			prog, err = ib.handleStep(tctx, tx, d)
			// With StepsPerTx above 1, further steps share this transaction, with one
			// commit instead of several. Each step's side effect and transition still commit
			// together. They also commit with the next steps, or roll back with them.
			for err == nil && prog == inbox.Continue && step-first+1 < ib.cfg.StepsPerTx && step+1 < ib.cfg.MaxSteps {
				step++
				d.Step = step
				prog, err = ib.handleStep(tctx, tx, d)
			}
			if err == nil && !validProgress(prog) {
				err = invalidProgress(prog) // never taken for Done, so the step rolls back
			}
			return err
		})
		if err != nil {
			return err
		}
		if err := ib.leaseInTx(sctx, tx, hold, prog); err != nil {
			return err
		}
		if prog == inbox.Done {
			replies, err := ib.saveReplies(sctx, tx, []*inbox.Delivery{d})
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(sctx, ib.q.markDone, d.Attempt, row.id); err != nil {
				return fmt.Errorf("mark inbox row done: %w", err)
			}
			res = &Result{Outcome: OutcomeProcessed, InboxID: row.id, Key: d.Key}
			if replies != nil {
				res.reply = replies[0]
			}
		}
		return nil
	})
	err := dbx.InTx(tctx, ib.db, body)
	endCommit(err)
	tracex.End(txSpan, err)
	if err != nil {
		*uncertain = *uncertain || errors.Is(err, dbx.ErrCommitUnknown)
		if c := opts.carry; c != nil && errors.Is(err, dbx.ErrCommitUnknown) {
			c.ok = false // the step may have committed
		}
		return nil, step, stepError(ctx, sctx, err)
	}
	if res != nil && res.Outcome == OutcomeProcessed {
		hold.Deleted() // the transaction deleted the lease row
	}
	if c := opts.carry; c != nil {
		c.ok = false // the step committed, so the key moved on
	}
	*uncertain = *uncertain || res == nil // steps committed, the delivery not finished
	return res, step, nil
}

// leaseInTx ends a step's transaction under the key's call lease. A step that finishes the
// delivery deletes the lease row. A step that leaves it unfinished checks that the lease is
// still held. Either fails when another Inbox took the lease over, and then nothing of the
// step commits.
func (ib *Inbox) leaseInTx(ctx context.Context, tx *sql.Tx, hold *callHold, prog inbox.Progress) error {
	if prog == inbox.Done {
		return hold.ReleaseTx(ctx, tx)
	}
	return hold.CheckTx(ctx, tx)
}

// stepError marks the error of a step whose time ran out as a timeout, whatever error the
// cancelled work returned. When the delivery's own time ran out, that is a shutdown, and
// stepError leaves the error alone.
func stepError(ctx, sctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(sctx.Err(), context.DeadlineExceeded) && !errors.Is(err, ErrHandlerTimeout) {
		return fmt.Errorf("%w: %w", ErrHandlerTimeout, err)
	}
	return err
}

type inboxRow struct {
	id          int64
	status      Status
	fingerprint string
	reason      sql.NullString
}

// claimOutcome is what a delivery does with the inbox row its claim made or found.
// decideClaim makes the decision for both paths, Process and the Batcher's runTx.
type claimOutcome int

const (
	claimRun       claimOutcome = iota // a row this claim inserted: run the handler
	claimConflict                      // the same key with another fingerprint, never a silent duplicate
	claimDuplicate                     // done, or quarantined and not reopened, so count it and change nothing
	claimResume                        // an earlier delivery's unfinished work, or reopened, so run the handler on it
)

// decideClaim decides for a claimed row. fresh says this claim inserted it. fingerprint is
// the delivery's, compared only when checkFingerprint is set. reopenFailed lets a
// quarantined row run again, for a replay's retry. A done row may have been finished by a
// concurrent delivery that resumed this one's work.
func decideClaim(fresh bool, r inboxRow, fingerprint string, checkFingerprint, reopenFailed bool) claimOutcome {
	switch {
	case fresh:
		return claimRun
	case checkFingerprint && r.fingerprint != fingerprint:
		return claimConflict
	case r.status == StatusDone || (r.status == StatusFailed && !reopenFailed):
		return claimDuplicate
	default:
		return claimResume
	}
}

// claim inserts the inbox row or locks the existing one. In the MySQL family the insert is
// an INSERT ... ON DUPLICATE KEY UPDATE rather than INSERT IGNORE. It behaves the same on
// the unique key, but it takes an exclusive lock on an existing row at once. INSERT IGNORE
// takes a shared lock, and two deliveries upgrading shared locks deadlock. Nor does it turn
// other errors, such as truncation, into warnings.
func (ib *Inbox) claim(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, dec decoded, step int) (inboxRow, bool, error) {
	var row inboxRow
	if step == 0 {
		payload, tombstone := storedPayload(d.Message.Payload)
		args := []any{d.Key, ib.cfg.BizType, string(StatusProcessing), nil, messageUUID(d.Message), d.Source.Topic, d.Source.Partition, d.Source.Offset,
			payload, dec.meta, dec.Fingerprint, d.Attempt, nil, nullID(d.ReplayID), time.Now().Add(ib.cfg.Retention).UTC(), tombstone, nil}
		q := faults.ClaimStatement(ib.q.claim) // the claim as it is, unless the fault hooks of internal/faults change it
		if ib.q.returning {
			// The claim returns the row, inserted or locked, in one round trip.
			var inserted bool
			err := tx.QueryRowContext(ctx, q, args...).Scan(&row.id, &inserted, &row.status, &row.fingerprint, &row.reason)
			if err != nil {
				return row, false, fmt.Errorf("claim inbox row: %w", err)
			}
			row.fingerprint = storedFingerprint(row.fingerprint)
			if inserted {
				if err := ib.stamp(ctx, tx, d.ReplayID, row.id); err != nil {
					return row, false, err
				}
			}
			return row, inserted, nil
		}
		r, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return row, false, fmt.Errorf("claim inbox row: %w", err)
		}
		id, err := r.LastInsertId()
		if err != nil {
			return row, false, fmt.Errorf("claim inbox row: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return row, false, fmt.Errorf("claim inbox row: %w", err)
		}
		if n == 1 {
			if err := ib.stamp(ctx, tx, d.ReplayID, id); err != nil {
				return row, false, err
			}
			return inboxRow{id: id, status: StatusProcessing, fingerprint: dec.Fingerprint}, true, nil
		}
		row.id = id
	} else {
		row.id = d.InboxID
	}
	err := tx.QueryRowContext(ctx, ib.q.lock, row.id).Scan(&row.status, &row.fingerprint, &row.reason)
	if err != nil {
		return row, false, fmt.Errorf("lock inbox row %d: %w", row.id, err)
	}
	row.fingerprint = storedFingerprint(row.fingerprint)
	return row, false, nil
}

// stamp lists inbox row id in replay_row as stamped by replay replayID, in the stamp's
// transaction. It does nothing when the delivery is not a replay's. A row a replay leaves
// 'done' is listed but not stamped, so `--replay-id` checks inbox.replay_id too.
func (ib *Inbox) stamp(ctx context.Context, tx *sql.Tx, replayID, id int64) error {
	if replayID <= 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, ib.q.stamp, replayID, id); err != nil {
		return fmt.Errorf("list inbox row %d as replayed by %d: %w", id, replayID, err)
	}
	return nil
}

func poisonKey(src inbox.Source, msg *message.Message) string {
	if src.Topic == "" {
		return "poison:" + messageUUID(msg)
	}
	return fmt.Sprintf("poison:%s/%d/%d", src.Topic, src.Partition, src.Offset)
}

// payloadFingerprint is the fingerprint of a record's whole value. It is the payload's
// fingerprint, unless the subscriber cut the value before it waited. Then it is the sha256
// the subscriber recorded of the value.
func payloadFingerprint(msg *message.Message) string {
	if cut, ok := msgsource.CutFrom(msg.Context()); ok {
		return hex.EncodeToString(cut.SHA256[:])
	}
	return fingerprint(msg.Payload)
}

// payloadSize is the size of a record's whole value, including what was cut.
func payloadSize(msg *message.Message) int {
	if cut, ok := msgsource.CutFrom(msg.Context()); ok {
		return cut.Size
	}
	return len(msg.Payload)
}

func fingerprint(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func nullID(id int64) any {
	if id == 0 {
		return nil
	}
	return id
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// withDialect marks ctx, a handler's, with its inbox's dialect, through
// dbx.ContextWithDialect. The Inserters and outbox Writers the handler uses read it.
func withDialect(ctx context.Context, d dbx.Dialect) context.Context {
	return dbx.ContextWithDialect(ctx, d)
}

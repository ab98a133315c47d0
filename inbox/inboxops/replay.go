package inboxops

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// ReplayTable records every replay (see migrations/00002).
const ReplayTable = "replay"

// ReplayRowTable lists the inbox rows each replay stamped (see migrations/00007), whatever
// the inbox table: `--replay-id` reads it instead of an index on inbox.replay_id.
const ReplayRowTable = "replay_row"

// Replay outcomes, as stored in replay.outcome.
const (
	ReplayOK          = "ok"          // every selected row ran; none came back quarantined
	ReplayPartial     = "partial"     // some rows were quarantined again (cause not fixed, or poison) or refused
	ReplayInterrupted = "interrupted" // stopped early: database unreachable or cancelled
	ReplayDryRun      = "dry_run"     // nothing ran
)

// ReplayOptions configure one replay.
type ReplayOptions struct {
	// Filter selects the rows; its BizType must be empty or the inbox's. Rows created after
	// the replay starts are never selected.
	Filter Filter
	// DryRun selects and records the replay (dry_run = 1) but runs nothing.
	DryRun bool
	// Rate limits replayed messages per second; 0 means no limit.
	Rate float64
	// OnRow, when set, is called after each row with its inbox.Result; a dry run's is the outcome
	// known before running: refused, quarantined (it does not decode), duplicate (done),
	// else none (inbox.Outcome "": the handler decides). The replay keeps no row: what a caller
	// wants to show of them, it takes here.
	OnRow func(Row, inbox.Result)
	// PageSize is how many rows one query reads; 0 means 200. A page is replayed before the
	// next is read, so memory holds one page whatever the selection's size.
	PageSize int
}

// ReplayReport summarises a replay. It is also what the replay table holds.
type ReplayReport struct {
	ID          int64  `json:"id"`
	BizType     string `json:"biz_type"`
	DryRun      bool   `json:"dry_run"`
	Filter      Filter `json:"filter"`
	Selected    int    `json:"selected"`
	Processed   int    `json:"processed"`
	Duplicates  int    `json:"duplicates"`
	Quarantined int    `json:"quarantined"`
	Conflicts   int    `json:"conflicts"`
	Poison      int    `json:"poison"`   // selected rows that cannot be decoded (re-quarantined)
	WasDone     int    `json:"was_done"` // selected rows already done (come back as duplicates)
	// Refused: selected rows not run, as they hold less than the delivered message
	// (Row.Replayable); they stay quarantined. The replay table has no column for them: a
	// loaded replay that ran counts them as the selected rows no other count holds.
	Refused    int       `json:"refused"`
	Outcome    string    `json:"outcome"` // ok, partial, interrupted, dry_run
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Replay re-runs the stored messages opts.Filter selects through ib's handler, exactly as a
// live delivery runs (Process with Reopen and the replay's id): a 'failed' row runs again, a
// 'processing' row resumes where its handler left it, a 'done' row is a duplicate and
// changes nothing, a poison row cannot be decoded and is quarantined again, and a row that
// holds less than the delivered message (Row.Replayable) is refused: not run, left as it
// is. A dry run reports, row by row, what the replay decides by the same decision. The
// replay is recorded in the replay table and its id stamped on the rows it re-ran.
//
// The returned error is non-nil only when the replay could not run to its end (selection or
// bookkeeping failed, database unreachable, context cancelled); the report then says how far
// it got.
func Replay(ctx context.Context, ib *inbox.Inbox, opts ReplayOptions) (ReplayReport, error) {
	f := opts.Filter
	biz, db := ib.BizType(), ib.DB()
	if f.BizType == "" {
		f.BizType = biz
	}
	rep := ReplayReport{BizType: biz, DryRun: opts.DryRun, Filter: f, StartedAt: time.Now().UTC()}
	if f.BizType != biz {
		return rep, fmt.Errorf("replay: filter biz type %q is not this inbox's %q", f.BizType, biz)
	}
	if err := f.Validate(); err != nil {
		return rep, fmt.Errorf("replay: %w", err)
	}
	if opts.Rate < 0 {
		return rep, fmt.Errorf("replay: rate %v is negative", opts.Rate)
	}
	if opts.PageSize < 0 {
		return rep, fmt.Errorf("replay: page size %d is negative", opts.PageSize)
	}
	store, err := NewStore(db, ib.Config().Table)
	if err != nil {
		return rep, err
	}
	maxID, err := store.MaxID(ctx)
	if err != nil {
		return rep, err
	}
	filterJSON, _ := json.Marshal(f)
	if rep.ID, err = recordStart(ctx, db, store.d, f.BizType, string(filterJSON), opts.DryRun, rep.StartedAt); err != nil {
		return rep, err
	}

	runErr := replayRows(ctx, ib, store, f, maxID, opts, &rep)
	switch {
	case runErr != nil:
		rep.Outcome, rep.Error = ReplayInterrupted, runErr.Error()
	case opts.DryRun:
		rep.Outcome = ReplayDryRun
	case rep.Quarantined+rep.Conflicts+rep.Refused > 0:
		rep.Outcome = ReplayPartial
	default:
		rep.Outcome = ReplayOK
	}
	rep.FinishedAt = time.Now().UTC()
	// Record the end even when ctx was cancelled: the operator must see how far it got.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, ferr := db.ExecContext(fctx, store.d.Rebind("UPDATE "+ReplayTable+` SET finished_at = ?, selected = ?, processed = ?, duplicate = ?,
 quarantined = ?, conflict = ?, outcome = ?, error = ? WHERE id = ?`),
		rep.FinishedAt, rep.Selected, rep.Processed, rep.Duplicates, rep.Quarantined, rep.Conflicts, rep.Outcome, nullString(rep.Error), rep.ID)
	if ferr != nil {
		ferr = fmt.Errorf("replay %d: record end: %w", rep.ID, ferr)
	}
	if runErr != nil {
		return rep, errors.Join(fmt.Errorf("replay %d interrupted after %d of the selected rows: %w", rep.ID, rep.Selected, runErr), ferr)
	}
	return rep, ferr
}

// defaultReplayPage is ReplayOptions.PageSize's default.
const defaultReplayPage = 200

// replayRows pages through the rows f selects by id — id > the last row seen, id <= maxID,
// ORDER BY id LIMIT page — and replays each page before reading the next: memory holds one
// page, however many rows match.
func replayRows(ctx context.Context, ib *inbox.Inbox, store *Store, f Filter, maxID int64, opts ReplayOptions, rep *ReplayReport) error {
	if maxID == 0 {
		return nil
	}
	var interval time.Duration
	if opts.Rate > 0 {
		interval = time.Duration(float64(time.Second) / opts.Rate)
	}
	size := opts.PageSize
	if size == 0 {
		size = defaultReplayPage
	}
	next := time.Now()
	var after int64
	for f.Limit == 0 || rep.Selected < f.Limit {
		page := f
		page.Limit = size
		if f.Limit > 0 {
			page.Limit = min(size, f.Limit-rep.Selected)
		}
		// Keyset paging: rows change status as they are replayed, so an OFFSET would skip
		// some; rows created after the start (id > maxID) are not part of this replay.
		rows, err := store.list(ctx, page, after, maxID)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		for _, row := range rows {
			after = row.ID
			rep.Selected++
			if row.Status == inbox.StatusDone {
				rep.WasDone++
			}
			run, known := replayPlan(ib, row)
			switch {
			case known.Outcome == inbox.OutcomeRefused:
				rep.Refused++
			case known.Outcome == inbox.OutcomeQuarantined:
				rep.Poison++
			}
			if opts.DryRun {
				if opts.OnRow != nil {
					opts.OnRow(row, known)
				}
				continue
			}
			if interval > 0 {
				if wait := time.Until(next); wait > 0 {
					t := time.NewTimer(wait)
					select {
					case <-ctx.Done():
					case <-t.C:
					}
					t.Stop()
				}
				next = time.Now().Add(interval)
			}
			if err := ctx.Err(); err != nil {
				rep.Selected--
				return err
			}
			r := known
			if run {
				if r, err = ib.Process(ctx, row.Message(), row.Source(), inbox.ProcessOptions{Reopen: true, ReplayID: rep.ID}); err != nil {
					rep.Selected--
					return err
				}
			}
			switch r.Outcome {
			case inbox.OutcomeProcessed:
				rep.Processed++
			case inbox.OutcomeDuplicate:
				rep.Duplicates++
			case inbox.OutcomeQuarantined:
				rep.Quarantined++
			case inbox.OutcomeConflict:
				rep.Conflicts++
			}
			if opts.OnRow != nil {
				opts.OnRow(row, r)
			}
		}
	}
	return nil
}

// replayPlan is the one decision of what a replay does with row, for the dry run and the
// replay alike: run reports whether it goes through Process; known is the outcome known
// before running, in Process's order — refused (the row holds less than the delivered
// message: never run), quarantined again (it does not decode), duplicate (done) — else a
// inbox.Result without an inbox.Outcome (the handler decides).
func replayPlan(ib *inbox.Inbox, row Row) (run bool, known inbox.Result) {
	known = inbox.Result{InboxID: row.ID, Key: row.DedupKey}
	if err := row.Replayable(); err != nil {
		known.Outcome, known.Reason, known.Err = inbox.OutcomeRefused, inbox.Reason(row.Reason), err
		return false, known
	}
	if _, err := ib.Decode(row.Message()); err != nil {
		known.Outcome, known.Reason, known.Err = inbox.OutcomeQuarantined, inbox.ReasonPoison, err
		if pe := (*inbox.PanicError)(nil); errors.As(err, &pe) {
			known.Reason = inbox.ReasonPanic
		}
		return true, known
	}
	if row.Status == inbox.StatusDone {
		known.Outcome = inbox.OutcomeDuplicate
	}
	return true, known
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// StoredRefused returns the refused rows of a replay as read from the replay table, which
// keeps no count of them: the selected rows no other count holds (every row a replay runs
// ends processed, duplicate, quarantined or conflict); 0 for a dry run.
func StoredRefused(r ReplayReport) int {
	if r.DryRun {
		return 0
	}
	return max(0, r.Selected-r.Processed-r.Duplicates-r.Quarantined-r.Conflicts)
}

// LoadReplay reads one row of the replay table.
func (s *Store) LoadReplay(ctx context.Context, id int64) (ReplayReport, error) {
	var r ReplayReport
	var filter string
	var finished sql.NullTime
	var errText sql.NullString
	err := s.db.QueryRowContext(ctx, s.d.Rebind(`SELECT id, biz_type, filter, dry_run, started_at, finished_at, selected, processed, duplicate,
 quarantined, conflict, outcome, error FROM `+ReplayTable+` WHERE id = ?`), id).Scan(&r.ID, &r.BizType, &filter, &r.DryRun, &r.StartedAt,
		&finished, &r.Selected, &r.Processed, &r.Duplicates, &r.Quarantined, &r.Conflicts, &r.Outcome, &errText)
	if err != nil {
		return r, fmt.Errorf("load replay %d: %w", id, err)
	}
	r.FinishedAt, r.Error = finished.Time, errText.String
	r.Refused = StoredRefused(r)
	if err := json.Unmarshal([]byte(filter), &r.Filter); err != nil {
		return r, fmt.Errorf("load replay %d: filter: %w", id, err)
	}
	return r, nil
}

// recordStart writes the replay's row and returns its id.
func recordStart(ctx context.Context, db *sql.DB, d dbx.Dialect, bizType, filter string, dryRun bool, started time.Time) (int64, error) {
	q := "INSERT INTO " + ReplayTable + " (biz_type, filter, dry_run, started_at) VALUES (?, ?, ?, ?)"
	var id int64
	if d.IsPostgres() {
		if err := db.QueryRowContext(ctx, d.Rebind(q+" RETURNING id"), bizType, filter, dryRun, started).Scan(&id); err != nil {
			return 0, fmt.Errorf("replay: record start: %w (run `router migrate`)", err)
		}
		return id, nil
	}
	res, err := db.ExecContext(ctx, q, bizType, filter, dryRun, started)
	if err != nil {
		return 0, fmt.Errorf("replay: record start: %w (run `router migrate`)", err)
	}
	if id, err = res.LastInsertId(); err != nil {
		return 0, fmt.Errorf("replay: record start: %w", err)
	}
	return id, nil
}

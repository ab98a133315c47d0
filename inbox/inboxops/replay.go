package inboxops

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// ReplayTable records every replay. Migration 00002 creates it.
const ReplayTable = "replay"

// ReplayRowTable lists the inbox rows each replay stamped, whatever the inbox table.
// Migration 00007 creates it. `--replay-id` reads it instead of an index on
// inbox.replay_id.
const ReplayRowTable = "replay_row"

// The replay outcomes are stored in replay.outcome.
const (
	ReplayOK          = "ok"          // every selected row ran; none came back quarantined
	ReplayPartial     = "partial"     // some rows were quarantined again (cause not fixed, or poison) or refused
	ReplayInterrupted = "interrupted" // stopped early: database unreachable or cancelled
	ReplayDryRun      = "dry_run"     // nothing ran
)

// ReplayOptions configure one replay.
type ReplayOptions struct {
	// Filter selects the rows. Its BizType must be empty or the inbox's. Rows created after
	// the replay starts are never selected.
	Filter Filter
	// DryRun selects and records the replay, with dry_run = 1, but runs nothing.
	DryRun bool
	// Rate limits replayed messages per second. 0 means no limit.
	Rate float64
	// OnRow, when set, is called after each row with its engine.Result. A dry run's result
	// is the outcome known before running. It is refused, quarantined for a row that does
	// not decode, or duplicate for a done row. Otherwise its engine.Outcome is "", because
	// the handler decides. The replay keeps no row, so a caller takes here what it wants to
	// show of them.
	OnRow func(Row, engine.Result)
	// PageSize is how many rows one query reads. 0 means 200. A page is replayed before the
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
	// Refused counts selected rows not run, because they hold less than the delivered
	// message, as Row.Replayable reports. They stay quarantined. The replay table has no
	// column for them. A loaded replay that ran counts them as the selected rows no other
	// count holds.
	Refused    int       `json:"refused"`
	Outcome    string    `json:"outcome"` // ok, partial, interrupted, dry_run
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Replay runs the stored messages opts.Filter selects again through ib's handler, exactly
// as a live delivery runs. It calls Process with Reopen and the replay's id.
//
//   - A 'failed' row runs again.
//   - A 'processing' row resumes where its handler left it.
//   - A 'done' row is a duplicate and changes nothing.
//   - A poison row cannot be decoded, and is quarantined again.
//   - A row that holds less than the delivered message, as Row.Replayable reports, is
//     refused. It is not run, and left as it is.
//
// A dry run reports, row by row, what the replay decides by the same decision. The replay
// is recorded in the replay table, and its id is stamped on the rows it ran again.
//
// The returned error is non-nil only when the replay could not run to its end. The
// selection or the bookkeeping may have failed, the database may have been unreachable, or
// the context cancelled. The report then says how far the replay got.
func Replay(ctx context.Context, ib *engine.Inbox, opts ReplayOptions) (ReplayReport, error) {
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
	// Record the end even when ctx was cancelled, because the operator must see how far it
	// got.
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

// replayRows pages through the rows f selects by id, and replays each page before reading
// the next. A page holds the rows with an id above the last row seen and at most maxID, in
// id order, up to the page size. So memory holds one page, however many rows match.
func replayRows(ctx context.Context, ib *engine.Inbox, store *Store, f Filter, maxID int64, opts ReplayOptions, rep *ReplayReport) error {
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
		// Paging is by key, because rows change status as they are replayed, and an OFFSET
		// would skip some. Rows created after the start, with an id above maxID, are not
		// part of this replay.
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
			if row.Status == engine.StatusDone {
				rep.WasDone++
			}
			run, known := replayPlan(ib, row)
			switch {
			case known.Outcome == engine.OutcomeRefused:
				rep.Refused++
			case known.Outcome == engine.OutcomeQuarantined:
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
				if r, err = ib.Process(ctx, row.Message(), row.Source(), engine.ProcessOptions{Reopen: true, ReplayID: rep.ID}); err != nil {
					rep.Selected--
					return err
				}
			}
			switch r.Outcome {
			case engine.OutcomeProcessed:
				rep.Processed++
			case engine.OutcomeDuplicate:
				rep.Duplicates++
			case engine.OutcomeQuarantined:
				rep.Quarantined++
			case engine.OutcomeConflict:
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
// replay alike. run reports whether the row goes through Process. known is the outcome
// known before running, in Process's order. A row that holds less than the delivered
// message is refused and never run. A row that does not decode is quarantined again. A
// done row is a duplicate. Otherwise known is an engine.Result without an engine.Outcome,
// because the handler decides.
func replayPlan(ib *engine.Inbox, row Row) (run bool, known engine.Result) {
	known = engine.Result{InboxID: row.ID, Key: row.DedupKey}
	if err := row.Replayable(); err != nil {
		known.Outcome, known.Reason, known.Err = engine.OutcomeRefused, engine.Reason(row.Reason), err
		return false, known
	}
	if _, err := ib.Decode(row.Message()); err != nil {
		known.Outcome, known.Reason, known.Err = engine.OutcomeQuarantined, engine.ReasonPoison, err
		if pe := (*engine.PanicError)(nil); errors.As(err, &pe) {
			known.Reason = engine.ReasonPanic
		}
		return true, known
	}
	if row.Status == engine.StatusDone {
		known.Outcome = engine.OutcomeDuplicate
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
// keeps no count of them. They are the selected rows no other count holds, because every
// row a replay runs ends processed, duplicate, quarantined or conflict. StoredRefused
// returns 0 for a dry run.
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

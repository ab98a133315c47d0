package routercmd

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
)

// filterFlags are the row filters shared by `replay` and `inbox ls|show|retry`.
type filterFlags struct {
	bizType   string
	status    string
	olderThan time.Duration
	orderIDs  []string
	reasons   []string
	since     string
	until     string
	limit     int
	replayID  int64
	output    string
}

func (f *filterFlags) register(fs *pflag.FlagSet, defaultStatus string, defaultLimit int) {
	f.status = defaultStatus
	f.limit = defaultLimit
	fs.StringVar(&f.bizType, "biz-type", "", "inbox biz type, e.g. coupon or notify (inferred when only one matches)")
	fs.StringVar(&f.status, "status", defaultStatus, "failed, processing (with --older-than), done, or all")
	fs.DurationVar(&f.olderThan, "older-than", 0, "only rows last updated more than this long ago, e.g. 10m (stuck 'processing' rows)")
	fs.StringArrayVar(&f.orderIDs, "order-id", nil, "only this order id / dedup key (repeatable)")
	fs.StringArrayVar(&f.reasons, "reason", nil, "only failed rows of this reason: poison, conflict, retries_exhausted, permanent, data, panic, timeout, or delayed: waiting for a delayed redelivery; resolved: the done rows an operator resolved (repeatable)")
	fs.StringVar(&f.since, "since", "", "only rows first received at or after this: RFC3339 (2026-11-11T00:00:00Z) or a duration ago (2h)")
	fs.StringVar(&f.until, "until", "", "only rows first received before this: RFC3339 or a duration ago")
	fs.IntVar(&f.limit, "limit", defaultLimit, "at most this many rows (0: no limit)")
	fs.Int64Var(&f.replayID, "replay-id", 0, "only rows stamped by this replay")
	fs.StringVar(&f.output, "output", "table", "table or json")
}

// parseWhen accepts an RFC3339 timestamp, or a duration such as "2h" or "2h ago" that means
// that long ago. An empty s is the zero time.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if d, err := time.ParseDuration(strings.TrimSpace(strings.TrimSuffix(s, "ago"))); err == nil && d > 0 {
		return now.Add(-d).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("--%s %q: use an RFC3339 time (2026-11-11T00:00:00Z) or a duration ago (2h, 30m)", flag, s)
}

// filter turns the flags into an inboxops.Filter, with the biz type not yet resolved. Its
// errors are bad input.
func (f *filterFlags) filter(refs []string) (inboxops.Filter, error) {
	out := inboxops.Filter{BizType: f.bizType, OlderThan: f.olderThan, Keys: f.orderIDs, Refs: refs, Limit: f.limit, ReplayID: f.replayID}
	switch s := strings.ToLower(f.status); s {
	case "", "all", "any":
	default:
		st, err := inboxops.ParseStatus(s)
		if err != nil {
			return out, badInput(fmt.Errorf("--status: %w", err))
		}
		out.Statuses = []engine.Status{st}
	}
	for _, r := range f.reasons {
		reason, err := inboxops.ParseReason(r)
		if err != nil {
			return out, badInput(fmt.Errorf("--reason: %w", err))
		}
		out.Reasons = append(out.Reasons, reason)
	}
	now := time.Now()
	var err error
	if out.Since, err = parseWhen("since", f.since, now); err != nil {
		return out, badInput(err)
	}
	if out.Until, err = parseWhen("until", f.until, now); err != nil {
		return out, badInput(err)
	}
	if f.output != "table" && f.output != "json" {
		return out, badInput(fmt.Errorf("--output %q: use table or json", f.output))
	}
	if f.replayID < 0 {
		return out, badInput(fmt.Errorf("--replay-id %d is negative", f.replayID))
	}
	if err := out.Validate(); err != nil {
		return out, badInput(err)
	}
	return out, nil
}

// checkBizType returns bad input when bt is set and no registered plugin has it.
func (a *app) checkBizType(bt string) error {
	if bt == "" {
		return nil
	}
	all, err := a.BizTypes()
	if err != nil {
		return err
	}
	if !slices.Contains(all, bt) {
		return badInput(fmt.Errorf("unknown biz type %q (registered: %s)", bt, strings.Join(all, ", ")))
	}
	return nil
}

// openFiltered parses the filter flags, checks the biz type and opens the inbox store. refs
// are order ids or row ids. `inbox ls` and `inbox show` start with it, and `replay` starts
// with the same steps.
func (a *app) openFiltered(ctx context.Context, ff filterFlags, refs []string) (inboxops.Filter, *sql.DB, *inboxops.Store, error) {
	f, err := ff.filter(refs)
	if err != nil {
		return f, nil, nil, err
	}
	if err := a.checkBizType(f.BizType); err != nil {
		return f, nil, nil, err
	}
	db, store, err := a.openInboxDB(ctx)
	return f, db, store, err
}

// openInboxDB opens the application database and checks the inbox and replay tables.
func (a *app) openInboxDB(ctx context.Context) (*sql.DB, *inboxops.Store, error) {
	db, err := a.OpenDB(ctx, min(a.Config.DB.MaxOpenConns, 4), "inbox", inboxops.ReplayTable)
	if err != nil {
		return nil, nil, err
	}
	store, err := inboxops.NewStore(db, "inbox")
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, store, nil
}

type replayFlags struct {
	filterFlags
	dryRun bool
	rate   float64
}

func (r *replayFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&r.dryRun, "dry-run", false, "list what would run and change nothing (the dry run is logged in the replay table)")
	fs.Float64Var(&r.rate, "rate", 0, "replay at most this many messages per second (0: no limit)")
}

func (a *app) replayCmd() *cobra.Command {
	var r replayFlags
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "re-run stored inbox messages through their plugin's handler (default: --status failed)",
		Long: `Re-runs stored inbox messages through the same handler path as a live delivery.
A failed row runs again; a processing row (selected with --older-than) resumes; a done row
comes back as a duplicate and changes nothing; a poison row cannot be decoded and is
quarantined again. Each replay is recorded in the replay table and its id stamped on the
rows it re-ran (inbox.replay_id).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.replay(cmd.Context(), r, nil)
		},
	}
	r.filterFlags.register(cmd.Flags(), string(engine.StatusFailed), 0)
	r.register(cmd.Flags())
	return cmd
}

// replay is `router replay` and `router inbox retry`.
func (a *app) replay(ctx context.Context, r replayFlags, refs []string) error {
	f, err := r.filter(refs)
	if err != nil {
		return err
	}
	if !(r.rate >= 0 && r.rate <= 1e6) { // NaN fails both
		return badInput(fmt.Errorf("--rate %v outside 0..1000000 (messages per second; 0: no limit)", r.rate))
	}
	if slices.Contains(f.Statuses, engine.StatusProcessing) && f.OlderThan == 0 {
		return badInput(errors.New("--status processing needs --older-than (a row updated recently may still be in flight)"))
	}
	if err := a.checkBizType(f.BizType); err != nil {
		return err
	}
	db, _, err := a.openInboxDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	ib, closeHandler, err := a.ReplayInbox(ctx, db, &f)
	if err != nil {
		return err
	}
	defer closeHandler()

	// Each row is printed as it is replayed, as a line of the table or an element of the
	// JSON output. Nothing of it is kept, so memory holds one page of rows however many are
	// selected.
	table := r.output == "table"
	if table {
		printf("%-8s %-10s %-36s %-10s %-18s %s\n", "ID", "BIZ_TYPE", "DEDUP_KEY", "WAS", "REASON", "RESULT")
	}
	var rows jsonStream
	rep, runErr := inboxops.Replay(ctx, ib, inboxops.ReplayOptions{Filter: f, DryRun: r.dryRun, Rate: r.rate, OnRow: func(row inboxops.Row, res engine.Result) {
		if table {
			printf("%-8d %-10s %-36s %-10s %-18s %s\n", row.ID, safeText(row.BizType), safeText(row.DedupKey), row.Status, safeText(dash(string(row.Reason))), safeText(replayResult(row, res, r.dryRun)))
			return
		}
		rows.add(replayRowJSON{ID: row.ID, DedupKey: row.DedupKey, BizType: row.BizType,
			Was: row.Status, WasReason: row.Reason, Outcome: string(res.Outcome), Reason: string(res.Reason),
			Result: replayResult(row, res, r.dryRun), Error: errText(res.Err)})
	}})
	if rep.ID == 0 {
		return runErr // nothing was recorded because the selection or the bookkeeping failed
	}
	if table {
		printReplayNotes(rep)
	} else if err := rows.close("replay", rep); err != nil {
		return err
	}
	return runErr
}

// jsonStream writes {"rows":[...],"<key>":<value>} on one line of stdout. It writes each
// row as it comes, escaped as writeJSON escapes, so a long list is never held in memory.
type jsonStream struct {
	n   int
	err error
}

func (s *jsonStream) write(str string) {
	if s.err == nil {
		_, s.err = os.Stdout.WriteString(str)
	}
}

func (s *jsonStream) add(row any) {
	b, err := safeJSON(row)
	if err != nil {
		s.err = cmp.Or(s.err, err)
		return
	}
	if s.n == 0 {
		s.write(`{"rows":[`)
	} else {
		s.write(",")
	}
	s.write(b)
	s.n++
}

// close ends the list, then writes v under key and ends the object.
func (s *jsonStream) close(key string, v any) error {
	if s.n == 0 {
		s.write(`{"rows":[`)
	}
	b, err := safeJSON(v)
	if err != nil {
		return cmp.Or(s.err, err)
	}
	k, _ := json.Marshal(key)
	s.write("]," + string(k) + ":" + b + "}\n")
	return s.err
}

type replayRowJSON struct {
	ID        int64         `json:"id"`
	DedupKey  string        `json:"dedup_key"`
	BizType   string        `json:"biz_type"`
	Was       engine.Status `json:"was"`
	WasReason string        `json:"was_reason,omitempty"`
	Outcome   string        `json:"outcome,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	Result    string        `json:"result"`
	Error     string        `json:"error,omitempty"`
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// replayResult says in words what happened to one row, or what would happen to it in a dry
// run. A dry run's res is what the replay decides before running the row, as
// inboxops.ReplayOptions.OnRow gets it.
func replayResult(row inboxops.Row, res engine.Result, dryRun bool) string {
	if res.Outcome == engine.OutcomeRefused {
		return "refused, left quarantined: " + errText(res.Err)
	}
	if dryRun {
		switch {
		case res.Outcome == engine.OutcomeQuarantined:
			return "would be quarantined again (" + string(res.Reason) + ": cannot be decoded)"
		case res.Outcome == engine.OutcomeDuplicate:
			return "would be a duplicate (done: no change)"
		case row.Reason == string(engine.ReasonConflict):
			return "would run under its original key (conflict)"
		case row.Status == engine.StatusProcessing:
			return "would resume"
		default:
			return "would run again"
		}
	}
	switch res.Outcome {
	case engine.OutcomeDuplicate:
		if row.Status == engine.StatusDone {
			return "duplicate (already done: no change)"
		}
		return "duplicate"
	case engine.OutcomeQuarantined:
		s := "quarantined again (" + string(res.Reason) + ")"
		if row.Poison() {
			s = "quarantined again (poison: cannot be decoded)"
		}
		if res.Err != nil && !row.Poison() {
			s += ": " + oneLineString(res.Err.Error(), 80)
		}
		return s
	}
	return string(res.Outcome)
}

func printReplayNotes(rep inboxops.ReplayReport) {
	if rep.Selected == 0 {
		printf("nothing matched the filter\n")
	}
	switch {
	case rep.WasDone > 0 && rep.DryRun:
		printf("note: %d selected rows are already done: replaying them would change nothing\n", rep.WasDone)
	case rep.WasDone > 0:
		printf("note: %d selected rows were already done: they came back as duplicates and nothing changed\n", rep.WasDone)
	}
	if rep.Poison > 0 {
		printf("note: %d poison rows cannot be decoded: replaying them quarantines them again (fix the producer; they stay for inspection)\n", rep.Poison)
	}
	if rep.Refused > 0 {
		printf("note: %d rows hold less than the delivered message (a value or headers over inbox.max_payload_bytes / max_metadata_bytes, or a minimal row): a replay refuses them; they stay quarantined for inspection (router inbox show <id>)\n", rep.Refused)
	}
	if rep.DryRun {
		printf("dry run: nothing was changed (logged as replay %d with dry_run=1)\n", rep.ID)
	}
	printf("REPLAY id=%d biz_type=%s dry_run=%t selected=%d processed=%d duplicates=%d quarantined=%d conflicts=%d refused=%d outcome=%s\n",
		rep.ID, rep.BizType, rep.DryRun, rep.Selected, rep.Processed, rep.Duplicates, rep.Quarantined, rep.Conflicts, rep.Refused, rep.Outcome)
}

// oneLineString flattens s to one line of at most n runes.
func oneLineString(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if n > 0 && utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}

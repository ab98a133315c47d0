package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/consoleui"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/outbox"
)

// ---------------------------------------------------------------- overview

func (c *Console) overview(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	c.render(w, r, http.StatusOK, "overview", "Overview", by, c.loadOverview(ctx))
}

// ---------------------------------------------------------------- inbox list

// pageSize is the rows of one inbox page.
const pageSize = 50

// reasons are the engine.Reason values that a failed row can have, as text.
var reasons = func() []string {
	var out []string
	for _, r := range inboxops.Reasons {
		out = append(out, string(r))
	}
	return out
}()

// listFilter is the inbox page's filter, as typed and as parsed.
type listFilter struct {
	Biz, Status, Reason, Key, Since, Until string

	since, until  time.Time
	before, after inboxops.Cursor
}

func parseListFilter(q url.Values, now time.Time) (listFilter, error) {
	f := listFilter{Biz: strings.TrimSpace(q.Get("biz")), Status: q.Get("status"), Reason: q.Get("reason"), Key: q.Get("key"),
		Since: strings.TrimSpace(q.Get("since")), Until: strings.TrimSpace(q.Get("until"))}
	var err error
	switch f.Status {
	case "", "processing", "done", "failed":
	default:
		return f, fmt.Errorf("status %q: use processing, done or failed", f.Status)
	}
	switch {
	case len(f.Biz) > 64:
		return f, errors.New("biz type longer than 64 bytes")
	case len(f.Key) > 191:
		return f, errors.New("key longer than 191 bytes")
	case len(f.Reason) > 32:
		return f, errors.New("reason longer than 32 bytes")
	}
	if f.Reason != "" {
		if _, err := inboxops.ParseReason(f.Reason); err != nil || !slices.Contains(reasons, f.Reason) {
			return f, fmt.Errorf("reason %q: use one of %s", consoleui.Visible(f.Reason), strings.Join(reasons, ", "))
		}
	}
	if f.since, err = consoleParseWhen("since", f.Since, now); err != nil {
		return f, err
	}
	if f.until, err = consoleParseWhen("until", f.Until, now); err != nil {
		return f, err
	}
	if !f.since.IsZero() && !f.until.IsZero() && !f.since.Before(f.until) {
		return f, errors.New("since is not before until")
	}
	if f.before, err = inboxops.ParseCursor(q.Get("before")); err != nil {
		return f, err
	}
	if f.after, err = inboxops.ParseCursor(q.Get("after")); err != nil {
		return f, err
	}
	return f, nil
}

// values is the filter as a query string, without a cursor.
func (f listFilter) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"biz": f.Biz, "status": f.Status, "reason": f.Reason, "key": f.Key, "since": f.Since, "until": f.Until} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

func (f listFilter) url(cursorName string, cur inboxops.Cursor) string {
	v := f.values()
	if !cur.IsZero() {
		v.Set(cursorName, cur.String())
	}
	if len(v) == 0 {
		return "/inbox"
	}
	return "/inbox?" + v.Encode()
}

// keyCandidates returns the keys that a typed key filter matches. One is the text as typed.
// When the text holds Go escapes such as \x1b or \u202e, the other is the key they spell.
// The console shows characters that do not show as themselves as such escapes.
// keyCandidates returns nil for "".
func keyCandidates(s string) []string {
	if s == "" {
		return nil
	}
	out := []string{s}
	if strings.Contains(s, `\`) {
		if u, err := strconv.Unquote(`"` + strings.ReplaceAll(s, `"`, `\"`) + `"`); err == nil && u != s && u != "" {
			out = append(out, u)
		}
	}
	return out
}

// consoleParseWhen accepts what `router replay --since` does, an RFC3339 time or a duration
// ago such as "2h" or "2h ago". It also accepts a date with a time or alone, read as UTC.
func consoleParseWhen(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	if d, err := time.ParseDuration(strings.TrimSpace(strings.TrimSuffix(s, "ago"))); err == nil && d > 0 {
		return now.Add(-d).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("%s %q: use a time (2026-11-11T10:00:00Z, 2026-11-11 10:00, UTC) or a duration ago (2h)", name, s)
}

type inboxData struct {
	F                             listFilter
	Match                         string // such as "300 match" or "10,000+ match", or "" when not counted
	BizTypes, Statuses, Reasons   []string
	Rows                          []inboxops.Row
	NewestURL, OlderURL, NewerURL string
	Paged                         bool
	Err                           string
	Replay                        replayForm
}

// replayForm is the inbox page's offer to replay what the filter selects.
type replayForm struct {
	Offered                                bool   // a replay handler is configured
	Allowed                                bool   // the filter is one a replay can select
	Note                                   string // why not, when not
	Biz, Status, Reason, Key, Since, Until string
}

func (c *Console) inboxList(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	now := time.Now()
	d := inboxData{BizTypes: c.bizTypes(c.statsOrZero()), Statuses: []string{"failed", "processing", "done"}, Reasons: reasons}
	f, err := parseListFilter(r.URL.Query(), now)
	d.F = f
	status := http.StatusOK
	if err != nil {
		d.Err, status = err.Error(), http.StatusBadRequest
		c.render(w, r, status, "inbox", "Inbox", by, d)
		return
	}
	q := inboxops.PageQuery{BizTypes: d.BizTypes, Reason: f.Reason, Keys: keyCandidates(f.Key), PoisonKeys: true, Since: f.since, Until: f.until,
		Before: f.before, After: f.after, Limit: pageSize}
	if f.Biz != "" {
		q.BizTypes = []string{f.Biz}
	}
	if f.Status != "" {
		q.Statuses = []engine.Status{engine.Status(f.Status)}
	}
	if len(q.BizTypes) > 0 {
		p, err := c.store.Page(ctx, q)
		if err != nil {
			d.Err, status = err.Error(), http.StatusInternalServerError
		}
		d.Rows = p.Rows
		if !p.Older.IsZero() {
			d.OlderURL = f.url("before", p.Older)
		}
		if !p.Newer.IsZero() {
			d.NewerURL = f.url("after", p.Newer)
		}
	}
	if len(q.BizTypes) > 0 && d.Err == "" {
		d.Match = c.match(ctx, f, q.BizTypes)
	}
	d.Paged = !f.before.IsZero() || !f.after.IsZero()
	d.NewestURL = f.url("", inboxops.Cursor{})
	d.Replay = c.replayOffer(f)
	c.render(w, r, status, "inbox", "Inbox", by, d)
}

// matchCap bounds the index entries that a list's count reads. More entries show as
// "10,000+".
const matchCap = 10000

// match counts the rows that the list's filter selects on every page, as "N match". It
// reads the index ranges that the page reads, at most matchCap+1 entries per biz type.
func (c *Console) match(ctx context.Context, f listFilter, bizTypes []string) string {
	var n int
	for _, b := range bizTypes {
		lf := inboxops.Filter{BizType: b, Keys: keyCandidates(f.Key), PoisonKeys: true, Since: f.since, Until: f.until, Limit: matchCap + 1}
		if f.Status != "" {
			lf.Statuses = []engine.Status{engine.Status(f.Status)}
		} else {
			lf.Statuses = []engine.Status{engine.StatusProcessing, engine.StatusDone, engine.StatusFailed}
		}
		if f.Reason != "" {
			lf.Reasons = []engine.Reason{engine.Reason(f.Reason)}
		}
		k, err := c.store.CountUpTo(ctx, lf)
		if err != nil {
			return ""
		}
		if n += k; n > matchCap {
			return consoleui.Num(matchCap) + "+ match"
		}
	}
	return consoleui.Num(int64(n)) + " match"
}

func (c *Console) replayOffer(f listFilter) replayForm {
	rf := replayForm{Offered: c.cfg.Replay != nil, Biz: f.Biz, Status: f.Status, Reason: f.Reason, Key: f.Key, Since: f.Since, Until: f.Until}
	switch {
	case f.Biz == "":
		rf.Note = "Choose a biz type to replay what this filter selects."
	case c.biz[f.Biz].Name == "":
		rf.Note = "No plugin of this router runs biz type " + consoleui.Visible(f.Biz) + ": its rows cannot be replayed here."
	case f.Status != "failed" && f.Status != "processing":
		rf.Note = "Choose status failed (or processing, for stuck rows) to replay."
	case f.Reason != "" && f.Status != "failed":
		rf.Note = "Only failed rows have a reason: choose status failed to replay them by reason."
	default:
		rf.Allowed = true
	}
	return rf
}

// invalidate drops the cached database figures after an action. The next page reads them
// again.
func (c *Console) invalidate() {
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.InvalidateDBStats()
	}
}

func (c *Console) statsOrZero() metrics.DBStats {
	if c.cfg.Metrics != nil {
		return c.cfg.Metrics.DBStats()
	}
	return metrics.DBStats{}
}

// ---------------------------------------------------------------- one row

type rowData struct {
	Row        inboxops.Row
	Plugins    []string
	Payload    consoleui.PayloadView
	Headers    []consoleui.KV
	History    []inbox.HistoryEntry
	HasHistory bool
	HistoryErr string
	Replay     *inboxops.ReplayReport // the replay that ?replay= names, which the page was opened after
	CanRetry   bool
	// CanResolve says the row is quarantined and the console is not read-only. A row that a
	// replay refuses, with a NotReplayable, may still be resolved.
	CanResolve bool
	Offered    bool
	// NotReplayable says why a replay refuses the row. Such a row holds less than the
	// delivered message, and the page offers no Retry for it.
	NotReplayable string
}

func (c *Console) inboxRow(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.message(w, r, http.StatusBadRequest, by, "No such row", []string{"An inbox row id is a positive number."}, link{"/inbox", "Inbox"})
		return
	}
	row, err := c.store.Get(ctx, id)
	if errors.Is(err, inboxops.ErrNoRow) {
		c.message(w, r, http.StatusNotFound, by, "No such row", []string{fmt.Sprintf("There is no inbox row %d (the cleaner deletes done rows after inbox.retention).", id)}, link{"/inbox", "Inbox"})
		return
	}
	if err != nil {
		c.message(w, r, http.StatusInternalServerError, by, "Inbox unreadable", []string{err.Error()}, link{"/inbox", "Inbox"})
		return
	}
	b := c.biz[row.BizType]
	d := rowData{Row: row, Plugins: b.Plugins, Payload: consoleui.ViewPayload(row.Payload, row.PayloadSize, row.Tombstone), Headers: consoleui.SortedHeaders(row.Metadata),
		Offered: c.cfg.Replay != nil && b.Name != "", NotReplayable: refusal(row)}
	d.CanRetry = row.Status == engine.StatusFailed && d.NotReplayable == ""
	d.CanResolve = c.cfg.Replay != nil && row.Status == engine.StatusFailed && !row.Delayed()
	if b.History != nil {
		d.HasHistory = true
		if d.History, err = b.History(ctx, c.cfg.DB, row.DedupKey); err != nil {
			d.HistoryErr = err.Error()
		}
	}
	if rid, err := strconv.ParseInt(r.URL.Query().Get("replay"), 10, 64); err == nil && rid > 0 {
		if rep, err := c.store.LoadReplay(ctx, rid); err == nil {
			d.Replay = &rep
		}
	}
	c.render(w, r, http.StatusOK, "row", fmt.Sprintf("Inbox row %d", row.ID), by, d)
}

// ---------------------------------------------------------------- replay actions

// replayed is one row of a replay or dry run as a result page shows it.
type replayed struct {
	Row    inboxops.Row
	Result string
	Failed bool
}

type replayOutcome struct {
	Report inboxops.ReplayReport
	Rows   []replayed // the first keepRows rows
	Err    error
}

// keepRows is how many rows of a replay its page lists.
const keepRows = 100

// errBusy says another replay of this console is running.
var errBusy = errors.New("another replay started from this console is still running: see Replays")

// startReplay runs opts in the background, one replay at a time. It runs under the
// console's context, not the request's. So a replay the browser stopped waiting for goes on
// to its end and records it. The returned channel gets the outcome.
func (c *Console) startReplay(r *http.Request, action string, opts inboxops.ReplayOptions) (<-chan replayOutcome, error) {
	if c.cfg.Replay == nil {
		return nil, errors.New("this console has no replay handler (the process was not started by the router command line)")
	}
	select {
	case c.busy <- struct{}{}:
	default:
		return nil, errBusy
	}
	out := make(chan replayOutcome, 1)
	var o replayOutcome
	opts.OnRow = func(row inboxops.Row, res engine.Result) {
		if len(o.Rows) < keepRows {
			row.Payload, row.Metadata = nil, nil
			o.Rows = append(o.Rows, replayed{Row: row, Result: resultText(row, res, opts.DryRun),
				Failed: res.Outcome == engine.OutcomeQuarantined || res.Outcome == engine.OutcomeConflict || res.Outcome == engine.OutcomeRefused})
		}
	}
	fields := watermill.LogFields{"action": action, "remote": r.RemoteAddr, "biz_type": opts.Filter.BizType, "dry_run": opts.DryRun}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		o.Report, o.Err = c.cfg.Replay(c.ctx, opts)
		if !opts.DryRun {
			c.invalidate() // the pages after it count the rows as they are now
		}
		fields["replay_id"], fields["selected"], fields["outcome"] = o.Report.ID, o.Report.Selected, o.Report.Outcome
		if o.Err != nil {
			c.cfg.Logger.Error("console action", o.Err, fields)
		} else {
			c.cfg.Logger.Info("console action", fields)
		}
		// The console is free before the page is answered, so the browser's next action
		// never finds this replay still running.
		<-c.busy
		out <- o
	}()
	return out, nil
}

// wait waits for a replay's outcome at most replayWait. ok is false when the replay goes on
// in the background, which the page then says, or when the browser left.
func (c *Console) wait(w http.ResponseWriter, r *http.Request, by who, ch <-chan replayOutcome) (replayOutcome, bool) {
	t := time.NewTimer(replayWait)
	defer t.Stop()
	select {
	case o := <-ch:
		return o, true
	case <-t.C:
		c.message(w, r, http.StatusAccepted, by, "Replay running", []string{
			fmt.Sprintf("The replay has run for %s and goes on in the background; it is recorded in the replay table when it ends.", replayWait)},
			link{"/replays", "Replays"})
	case <-r.Context().Done():
	}
	return replayOutcome{}, false
}

// resultText says in words what happened to one replayed row, or what would happen to it in
// a dry run. A dry run's res is what the replay decides before running the row, as
// inboxops.ReplayOptions.OnRow gets it.
func resultText(row inboxops.Row, res engine.Result, dryRun bool) string {
	if res.Outcome == engine.OutcomeRefused {
		return "refused, left quarantined: " + consoleui.Cut(errText(res.Err), 200)
	}
	if dryRun {
		switch {
		case res.Outcome == engine.OutcomeQuarantined:
			return "would be quarantined again (" + string(res.Reason) + ": cannot be decoded)"
		case res.Outcome == engine.OutcomeDuplicate:
			return "would be a duplicate (done: no change)"
		case row.Status == engine.StatusProcessing:
			return "would resume"
		}
		return "would run again"
	}
	s := string(res.Outcome)
	if res.Reason != "" {
		s += " (" + string(res.Reason) + ")"
	}
	if res.Err != nil && res.Outcome != engine.OutcomeProcessed {
		s += ": " + consoleui.Cut(res.Err.Error(), 120)
	}
	return s
}

func (c *Console) retryRow(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.message(w, r, http.StatusBadRequest, by, "No such row", []string{"An inbox row id is a positive number."})
		return
	}
	row, err := c.store.Get(ctx, id)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, inboxops.ErrNoRow) {
			status = http.StatusNotFound
		}
		c.message(w, r, status, by, "Not retried", []string{err.Error()}, link{"/inbox", "Inbox"})
		return
	}
	back := link{fmt.Sprintf("/inbox/%d", id), fmt.Sprintf("Row %d", id)}
	if row.Status != engine.StatusFailed {
		c.message(w, r, http.StatusConflict, by, "Not retried", []string{fmt.Sprintf("Row %d is %s: only failed rows are retried here (a stuck processing row: replay status processing with an older-than).", id, row.Status)}, back)
		return
	}
	if why := refusal(row); why != "" {
		c.message(w, r, http.StatusConflict, by, "Not retried", []string{fmt.Sprintf("Row %d cannot be replayed: %s. It stays quarantined for inspection.", id, why)}, back)
		return
	}
	// This is `router inbox retry --biz-type B --order-id K`. The unique key selects this
	// row only, and only while it is still failed. So a second press changes nothing.
	f := inboxops.Filter{BizType: row.BizType, Statuses: []engine.Status{engine.StatusFailed}, Keys: []string{row.DedupKey}}
	ch, err := c.startReplay(r, "retry", inboxops.ReplayOptions{Filter: f})
	if err != nil {
		c.message(w, r, http.StatusConflict, by, "Not retried", []string{err.Error()}, back)
		return
	}
	o, ok := c.wait(w, r, by, ch)
	if !ok {
		return
	}
	if o.Report.ID == 0 {
		c.message(w, r, http.StatusInternalServerError, by, "Not retried", []string{errText(o.Err)}, back)
		return
	}
	http.Redirect(w, r, fmt.Sprintf("/inbox/%d?replay=%d", id, o.Report.ID), http.StatusSeeOther)
}

// resolveRow is `router inbox resolve <id> --reason <text>`. It makes the row done with
// reason resolved and records the resolution in the replay table. The row's page then shows
// it.
func (c *Console) resolveRow(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.message(w, r, http.StatusBadRequest, by, "No such row", []string{"An inbox row id is a positive number."})
		return
	}
	back := link{fmt.Sprintf("/inbox/%d", id), fmt.Sprintf("Row %d", id)}
	if c.cfg.Replay == nil {
		c.message(w, r, http.StatusConflict, by, "Not resolved", []string{"This console is read-only for the inbox (the process was not started by the router command line)."}, back)
		return
	}
	if err := r.ParseForm(); err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not resolved", []string{err.Error()}, back)
		return
	}
	res, err := c.store.Resolve(ctx, id, r.PostForm.Get("reason"))
	fields := watermill.LogFields{"action": "inbox resolve", "remote": r.RemoteAddr, "inbox_id": id}
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, inboxops.ErrBadReason):
			status = http.StatusBadRequest
		case errors.Is(err, inboxops.ErrNoRow):
			status = http.StatusNotFound
		case errors.Is(err, inboxops.ErrNotQuarantined):
			status = http.StatusConflict
		}
		if status == http.StatusInternalServerError {
			c.cfg.Logger.Error("console action", err, fields)
		}
		c.message(w, r, status, by, "Not resolved", []string{err.Error()}, back)
		return
	}
	c.invalidate()
	fields["biz_type"], fields["replay_id"], fields["was"] = res.Row.BizType, res.ReplayID, res.Row.Reason
	c.cfg.Logger.Info("console action", fields)
	http.Redirect(w, r, fmt.Sprintf("/inbox/%d?replay=%d", id, res.ReplayID), http.StatusSeeOther)
}

// refusal says why a replay refuses row, or "" when a replay runs it. The reason is what of
// the delivered message the row does not hold.
func refusal(row inboxops.Row) string {
	err := row.Replayable()
	if err == nil {
		return ""
	}
	return strings.TrimPrefix(err.Error(), inboxops.ErrNotReplayable.Error()+": ")
}

// replayData is the page of a replay, or of a dry run with the form that runs its replay.
type replayData struct {
	Report inboxops.ReplayReport
	Rows   []replayed
	More   int // selected rows not listed
	Err    string
	Filter string // as `router replay` flags
	Run    runForm
	// NoRun says why a dry run offers no replay. Every row the replay would run is poison
	// that the plugin's decoder refuses now, so the replay would only quarantine it again.
	NoRun string
}

// runForm carries a previewed selection to the replay that runs it.
type runForm struct {
	Biz, Status, Reason, Key, Since, Until, OlderThan string
	Preview                                           int64
}

// replayFilter reads the replay form into the selection a replay runs.
func (c *Console) replayFilter(r *http.Request, now time.Time) (inboxops.Filter, runForm, error) {
	p := r.PostForm
	rf := runForm{Biz: p.Get("biz"), Status: p.Get("status"), Reason: p.Get("reason"), Key: p.Get("key"), Since: strings.TrimSpace(p.Get("since")),
		Until: strings.TrimSpace(p.Get("until")), OlderThan: strings.TrimSpace(p.Get("older_than"))}
	f := inboxops.Filter{BizType: rf.Biz}
	if c.biz[rf.Biz].Name == "" {
		return f, rf, fmt.Errorf("biz type %q: not one this router runs", consoleui.Visible(rf.Biz))
	}
	switch rf.Status {
	case "failed", "processing":
		f.Statuses = []engine.Status{engine.Status(rf.Status)}
	default:
		return f, rf, fmt.Errorf("status %q: a replay here selects failed rows, or processing ones with an older-than", consoleui.Visible(rf.Status))
	}
	if rf.OlderThan != "" {
		d, err := time.ParseDuration(rf.OlderThan)
		if err != nil || d <= 0 {
			return f, rf, fmt.Errorf("older than %q: a positive duration (10m)", consoleui.Visible(rf.OlderThan))
		}
		f.OlderThan = d
	}
	if rf.Status == "processing" && f.OlderThan == 0 {
		return f, rf, errors.New("status processing needs an older-than (a row updated recently may still be in flight)")
	}
	if rf.Reason != "" {
		r, err := inboxops.ParseReason(rf.Reason)
		if err != nil || string(r) != rf.Reason || rf.Status != "failed" {
			return f, rf, fmt.Errorf("reason %q: a replay by reason selects failed rows of one of %s", consoleui.Visible(rf.Reason), strings.Join(reasons, ", "))
		}
		f.Reasons = []engine.Reason{r}
	}
	f.Keys = keyCandidates(rf.Key)
	var err error
	if f.Since, err = consoleParseWhen("since", rf.Since, now); err != nil {
		return f, rf, err
	}
	if f.Until, err = consoleParseWhen("until", rf.Until, now); err != nil {
		return f, rf, err
	}
	if err := f.Validate(); err != nil {
		return f, rf, err
	}
	return f, rf, nil
}

func (c *Console) replay(w http.ResponseWriter, r *http.Request, by who) {
	if err := r.ParseForm(); err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not replayed", []string{err.Error()})
		return
	}
	now := time.Now().UTC()
	f, rf, err := c.replayFilter(r, now)
	if err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not replayed", []string{err.Error()}, link{"/inbox", "Inbox"})
		return
	}
	run := r.PostForm.Get("run") == "1"
	if !run {
		// The dry run comes first and pins the end of the selection. So the replay it
		// offers never takes rows received after the operator saw the preview.
		if f.Until.IsZero() {
			f.Until = now.Truncate(time.Microsecond)
		}
	} else if err := c.checkPreview(r, f); err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not replayed", []string{err.Error()}, link{"/inbox", "Inbox"})
		return
	}
	action := "replay"
	if !run {
		action = "replay dry run"
	}
	ch, err := c.startReplay(r, action, inboxops.ReplayOptions{Filter: f, DryRun: !run})
	if err != nil {
		c.message(w, r, http.StatusConflict, by, "Not replayed", []string{err.Error()}, link{"/replays", "Replays"})
		return
	}
	o, ok := c.wait(w, r, by, ch)
	if !ok {
		return
	}
	d := replayData{Report: o.Report, Rows: o.Rows, More: o.Report.Selected - len(o.Rows), Err: errText(o.Err), Filter: filterText(f)}
	status := http.StatusOK
	if o.Report.ID == 0 {
		status = http.StatusInternalServerError
	}
	title := fmt.Sprintf("Replay %d", o.Report.ID)
	if !run {
		title = fmt.Sprintf("Dry run %d", o.Report.ID)
		rf.Since, rf.Until = "", ""
		if !f.Since.IsZero() {
			rf.Since = f.Since.Format(time.RFC3339Nano)
		}
		rf.Until = f.Until.Format(time.RFC3339Nano)
		rf.Preview = o.Report.ID
		if d.NoRun = noRunReason(o.Report); d.NoRun == "" {
			d.Run = rf
		}
	}
	c.render(w, r, status, "replay", title, by, d)
}

// noRunReason says why a dry run's replay is not offered, or "" when it is. The replay is
// not offered when every row it would run is poison that the decoder refuses now. Rows
// that hold less than the delivered message are refused and never run.
func noRunReason(rep inboxops.ReplayReport) string {
	run := rep.Selected - rep.Refused
	if rep.Poison == 0 || rep.Poison < run {
		return ""
	}
	return fmt.Sprintf("No replay offered: each of the %d rows it would run is poison that the plugin's decoder still refuses, so the replay would only quarantine them again. "+
		"Deploy a plugin whose decoder reads them and preview again, or resolve each row whose corrected message ran under its own key.", rep.Poison)
}

// checkPreview refuses a replay that does not run the selection of a recent dry run of this
// form. The preview comes first.
func (c *Console) checkPreview(r *http.Request, f inboxops.Filter) error {
	id, err := strconv.ParseInt(r.PostForm.Get("preview"), 10, 64)
	if err != nil || id <= 0 {
		return errors.New("a replay runs after its dry run: preview it first")
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	prev, err := c.store.LoadReplay(ctx, id)
	if err != nil {
		return err
	}
	want, _ := json.Marshal(f)
	got, _ := json.Marshal(prev.Filter)
	switch {
	case !prev.DryRun || prev.Outcome != inboxops.ReplayDryRun:
		return fmt.Errorf("replay %d is not a finished dry run: preview the replay first", id)
	case string(want) != string(got):
		return fmt.Errorf("the selection differs from dry run %d's: preview it again", id)
	case time.Since(prev.StartedAt) > previewTTL:
		return fmt.Errorf("dry run %d is older than %s: preview it again", id, previewTTL)
	}
	return nil
}

// ---------------------------------------------------------------- replays list

type replaysData struct {
	Replays  []replayRow
	OlderURL string
	Err      string
}

func (c *Console) replays(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	var d replaysData
	rows, err := c.recentReplays(ctx, max(before, 0), pageSize+1)
	if err != nil {
		d.Err = err.Error()
	}
	if len(rows) > pageSize {
		rows = rows[:pageSize]
		d.OlderURL = fmt.Sprintf("/replays?before=%d", rows[len(rows)-1].ID)
	}
	d.Replays = rows
	c.render(w, r, http.StatusOK, "replays", "Replays", by, d)
}

// ---------------------------------------------------------------- parked events

type parkedData struct {
	Rows          []outbox.ParkedRow
	Refused, Held int64
	Err           string
	Bulk          parkedBulkForm
}

// parkedBulkForm is the page's choice of refused events by topic and reason. Counted says
// the page counted them, as `router outbox retry --topic T --reason R --dry-run` does.
type parkedBulkForm struct {
	Topic, Reason string
	Topics        []string // the topics of the listed events
	Reasons       []string
	Counted       bool
	Chosen        outbox.Chosen
	Choice        string // the choice in words, such as "topic orders, reason unknown_topic"
}

// parkedPage is how many parked events the page lists.
const parkedPage = 200

func (c *Console) parkedList(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	var d parkedData
	var err error
	if d.Rows, err = c.parked.List(ctx, parkedPage); err == nil {
		d.Refused, d.Held, err = c.parked.Count(ctx)
	}
	status := http.StatusOK
	if err != nil {
		d.Err = err.Error()
	}
	d.Bulk = parkedBulkForm{Reasons: parkedReasons}
	for _, row := range d.Rows {
		if row.HeldBehind == "" && !slices.Contains(d.Bulk.Topics, row.Topic) {
			d.Bulk.Topics = append(d.Bulk.Topics, row.Topic)
		}
	}
	slices.Sort(d.Bulk.Topics)
	q := r.URL.Query()
	if q.Get("count") != "" && err == nil {
		sel, serr := parkedSelection(q.Get("topic"), q.Get("reason"))
		d.Bulk.Topic, d.Bulk.Reason, d.Bulk.Choice = sel.Topic, sel.Reason, choiceText(sel)
		if serr == nil {
			d.Bulk.Chosen, serr = c.parked.Choose(ctx, sel, 0)
		}
		if serr != nil {
			d.Err, status = serr.Error(), http.StatusBadRequest
		} else {
			d.Bulk.Counted = true
		}
	}
	c.render(w, r, status, "outbox", "Parked events", by, d)
}

// parkedReasons are the reasons of refused parked events, which a bulk retry or drop
// chooses by. They are those of `router outbox retry --reason`.
var parkedReasons = []string{outbox.ReasonUnknownTopic, outbox.ReasonTooLarge, outbox.ReasonInvalidRecord, outbox.ReasonUnauthorized}

// parkedSelection checks a topic and a reason typed in the page's bulk form. An empty topic
// or reason chooses any.
func parkedSelection(topic, reason string) (outbox.Selection, error) {
	sel := outbox.Selection{Topic: strings.TrimSpace(topic), Reason: reason}
	switch {
	case sel.Reason != "" && !slices.Contains(parkedReasons, sel.Reason):
		return sel, fmt.Errorf("reason %q: one of %s (held events are released with the event they wait behind)", consoleui.Visible(sel.Reason), strings.Join(parkedReasons, ", "))
	case len(sel.Topic) > 249 || !utf8.ValidString(sel.Topic) || strings.ContainsFunc(sel.Topic, unicode.IsControl):
		return sel, fmt.Errorf("topic %q: not a topic name", consoleui.Visible(sel.Topic))
	}
	return sel, nil
}

// choiceText says which refused events sel chooses.
func choiceText(sel outbox.Selection) string {
	var parts []string
	if sel.Topic != "" {
		parts = append(parts, "topic "+consoleui.Visible(sel.Topic))
	}
	if sel.Reason != "" {
		parts = append(parts, "reason "+sel.Reason)
	}
	if len(parts) == 0 {
		return "every refused event"
	}
	return strings.Join(parts, ", ")
}

// parkedBulk is `router outbox retry --topic T --reason R` and `router outbox drop --topic
// T --reason R --yes`. The form comes from the page's count, and carries the refused events
// it counted. The action refuses to release more than were counted, so events parked after
// the count wait for another count.
func (c *Console) parkedBulk(w http.ResponseWriter, r *http.Request, by who) {
	if err := r.ParseForm(); err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not done", []string{err.Error()})
		return
	}
	drop := strings.HasSuffix(r.URL.Path, "/drop")
	back := link{"/outbox", "Parked events"}
	sel, err := parkedSelection(r.PostForm.Get("topic"), r.PostForm.Get("reason"))
	if err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not done", []string{err.Error()}, back)
		return
	}
	v := url.Values{"count": {"1"}, "topic": {sel.Topic}, "reason": {sel.Reason}}
	recount := link{"/outbox?" + v.Encode(), "Count again"}
	counted, err := strconv.ParseInt(r.PostForm.Get("counted"), 10, 64)
	if err != nil || counted < 0 {
		c.message(w, r, http.StatusBadRequest, by, "Not done", []string{"Count the events first (dry run): the action releases at most the events it counted."}, recount, back)
		return
	}
	if drop && r.PostForm.Get("confirm") != "yes" {
		c.message(w, r, http.StatusBadRequest, by, "Not dropped", []string{"Dropping deletes the events for good: tick the box beside Drop to confirm."}, recount, back)
		return
	}
	// The batches commit one by one. A request that runs out of time keeps those that
	// committed, and its page says how far it got.
	ctx, cancel := context.WithTimeout(r.Context(), replayWait)
	defer cancel()
	chosen, err := c.parked.Choose(ctx, sel, 0)
	if err != nil {
		c.message(w, r, http.StatusInternalServerError, by, "Not done", []string{err.Error()}, back)
		return
	}
	choice := choiceText(sel)
	switch {
	case chosen.Refused == 0:
		c.message(w, r, http.StatusOK, by, "Nothing to do", []string{"No refused event is parked for " + choice + " now."}, back)
		return
	case chosen.Refused > counted:
		c.message(w, r, http.StatusConflict, by, "Not done", []string{fmt.Sprintf("%d refused events are parked for %s now, and %d were counted: count them again.",
			chosen.Refused, choice, counted)}, recount, back)
		return
	}
	action := "outbox retry selected"
	var rel outbox.BulkRelease
	if drop {
		action = "outbox drop selected"
		rel, err = c.parked.DropSelected(ctx, sel, nil)
	} else {
		rel, err = c.parked.RetrySelected(ctx, sel, nil)
	}
	if rel.Released > 0 {
		c.invalidate()
	}
	fields := watermill.LogFields{"action": action, "remote": r.RemoteAddr, "topic": sel.Topic, "reason": sel.Reason, "released": rel.Released, "moved": rel.Moved}
	if err != nil {
		c.cfg.Logger.Error("console action", err, fields)
		c.message(w, r, http.StatusInternalServerError, by, "Not done", []string{fmt.Sprintf("After %d of %d refused events (%d events back in the outbox; the rest are still parked): %v",
			rel.Released, chosen.Refused, rel.Moved, err)}, recount, back)
		return
	}
	c.cfg.Logger.Info("console action", fields)
	line := fmt.Sprintf("Retried %d refused events of %s: %d events back in the outbox (they and the events held behind them); the relay publishes them in their original order.",
		rel.Released, choice, rel.Moved)
	verb := "Retried"
	if drop {
		verb = "Dropped"
		line = fmt.Sprintf("Dropped %d refused events of %s for good; %d events held behind them are back in the outbox.", rel.Released, choice, rel.Moved)
	}
	c.message(w, r, http.StatusOK, by, fmt.Sprintf("%s %d events", verb, rel.Released), []string{line}, back)
}

// parkedAction is `router outbox retry <id>` and `router outbox drop <id> --yes`.
func (c *Console) parkedAction(w http.ResponseWriter, r *http.Request, by who) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	if err := r.ParseForm(); err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not done", []string{err.Error()})
		return
	}
	ref := r.PathValue("id")
	drop := strings.HasSuffix(r.URL.Path, "/drop")
	back := link{"/outbox", "Parked events"}
	if _, err := strconv.ParseUint(ref, 10, 64); err != nil {
		c.message(w, r, http.StatusBadRequest, by, "Not done", []string{"A parked event is named by its outbox id here."}, back)
		return
	}
	action, verb := "outbox retry", "Retried"
	var rel outbox.Release
	var err error
	if drop {
		action, verb = "outbox drop", "Dropped"
		if r.PostForm.Get("confirm") != "yes" {
			c.message(w, r, http.StatusBadRequest, by, "Not dropped", []string{"Dropping deletes the event for good: tick the box to confirm."}, back)
			return
		}
		rel, err = c.parked.Drop(ctx, ref)
	} else {
		rel, err = c.parked.Retry(ctx, ref)
	}
	fields := watermill.LogFields{"action": action, "remote": r.RemoteAddr, "outbox_id": ref}
	if err != nil {
		c.cfg.Logger.Error("console action", err, fields)
		status := http.StatusInternalServerError
		if errors.Is(err, outbox.ErrNotParked) || errors.Is(err, outbox.ErrHeld) || errors.Is(err, outbox.ErrBadRef) {
			status = http.StatusConflict
		}
		c.message(w, r, status, by, "Not done", []string{err.Error()}, back)
		return
	}
	c.invalidate()
	fields["event_id"], fields["moved"] = rel.Event.EventID, rel.Moved
	c.cfg.Logger.Info("console action", fields)
	e := rel.Event
	line := fmt.Sprintf("Retried event %s (topic %s, key %s): %d events back in the outbox (it and %d held behind it); the relay publishes them in their original order.",
		consoleui.Visible(e.EventID), consoleui.Visible(e.Topic), consoleui.Visible(e.Key), rel.Moved, rel.Moved-1)
	if drop {
		line = fmt.Sprintf("Dropped event %s (topic %s, key %s, %d bytes) for good; %d events held behind it are back in the outbox.",
			consoleui.Visible(e.EventID), consoleui.Visible(e.Topic), consoleui.Visible(e.Key), e.Size, rel.Moved)
	}
	c.message(w, r, http.StatusOK, by, verb+" event "+ref, []string{line}, back)
}

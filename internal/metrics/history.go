package metrics

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// HistoryTable holds the deliveries per biz type, UTC minute and outcome, to which every
// router adds its own counts. Migration 00015 creates it. The console's chart and last hour
// read it.
const HistoryTable = "inbox_history"

const (
	// HistoryFlushEvery is how often a router adds its counts to HistoryTable.
	HistoryFlushEvery = 10 * time.Second
	// HistoryRetention is how long HistoryTable keeps a minute.
	HistoryRetention = 7 * 24 * time.Hour
	// historyBacklog bounds the minutes a router keeps unwritten while its database is
	// down. Past it, the oldest minute's counts are dropped and counted in
	// onceflow_inbox_history_dropped_total.
	historyBacklog = 24 * 60
	// historyFlushTimeout bounds one flush. When a flush ends without a commit, its counts
	// are kept for the next one.
	historyFlushTimeout = 30 * time.Second
	// historyRows is the most rows of one statement of a flush. A flush is one
	// transaction, whatever its statements.
	historyRows = 1000
	// historyPruneBatch is the most rows one delete of the retention removes.
	// historyPruneEvery is how often a router deletes them.
	historyPruneBatch = 1000
	historyPruneEvery = time.Hour
	// historyMinutes is the console's last hour.
	historyMinutes = 60
)

type historyKey struct {
	biz     string
	minute  int64 // Unix time / 60
	outcome string
}

// history keeps a router's deliveries per biz type, minute and outcome that are not in
// HistoryTable yet, and flush adds them to it. A flush moves the pending counts to
// inflight and writes them in one transaction. It forgets them once it committed. When it
// did not, they go back to pending for the next flush. So a delta is written once, and a
// failed flush loses none. Only the backlog bound drops counts, and it counts what it drops.
type history struct {
	db      *sql.DB
	dropped prometheus.Counter

	flushMu   sync.Mutex // one flush at a time
	lastPrune time.Time  // RunHistory's

	mu       sync.Mutex
	pending  map[historyKey]int64
	minutes  map[int64]int        // pending's keys per minute
	inflight map[historyKey]int64 // the counts of the flush in progress
	// committing is set while a flush's COMMIT is under way. commits counts the flushes'
	// COMMITs that ended. A reader that saw neither change while it read the table knows
	// whether the table holds inflight.
	committing bool
	commits    int64
}

func newHistory(db *sql.DB) *history {
	return &history{db: db, pending: map[historyKey]int64{}, minutes: map[int64]int{},
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "onceflow", Name: "inbox_history_dropped_total",
			Help: "Deliveries left out of the console's history (inbox_history): the database could not be written for " +
				"more than 24 hours of minutes, and the oldest were dropped.",
		})}
}

func (h *history) add(biz, outcome string, now time.Time) {
	k := historyKey{biz: biz, minute: now.Unix() / 60, outcome: outcome}
	h.mu.Lock()
	if h.pending[k] == 0 {
		h.minutes[k.minute]++
		if h.minutes[k.minute] == 1 && len(h.minutes) > historyBacklog {
			h.trim()
		}
	}
	h.pending[k]++
	h.mu.Unlock()
}

// trim drops the oldest minutes of pending past historyBacklog minutes and counts their
// deliveries in dropped. The caller holds h.mu. Only a new minute crosses the bound, so
// while the backlog is full trim runs once a minute.
func (h *history) trim() {
	for len(h.minutes) > historyBacklog {
		oldest := int64(math.MaxInt64)
		for m := range h.minutes {
			oldest = min(oldest, m)
		}
		for k, n := range h.pending {
			if k.minute == oldest {
				h.dropped.Add(float64(n))
				delete(h.pending, k)
			}
		}
		delete(h.minutes, oldest)
	}
}

// historyUpsert adds n rows' counts, on MariaDB and MySQL 8 or on PostgreSQL.
func historyUpsert(d dbx.Dialect, n int) string {
	q := "INSERT INTO " + HistoryTable + " (biz_type, minute, outcome, n) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?), ", n), ", ")
	if d.IsPostgres() {
		return d.Rebind(q + " ON CONFLICT (biz_type, minute, outcome) DO UPDATE SET n = " + HistoryTable + ".n + EXCLUDED.n")
	}
	return q + " ON DUPLICATE KEY UPDATE n = n + VALUES(n)"
}

// flush adds the pending counts to HistoryTable in one transaction, with the rows in key
// order. So two routers adding the same minutes lock them in the same order and do not
// deadlock.
func (h *history) flush(ctx context.Context) error {
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	h.mu.Lock()
	batch := h.pending
	h.pending, h.minutes, h.inflight = map[historyKey]int64{}, map[int64]int{}, batch
	h.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	err := h.write(ctx, batch)
	h.mu.Lock()
	h.inflight = nil
	if err != nil {
		for k, n := range batch {
			if h.pending[k] == 0 {
				h.minutes[k.minute]++
			}
			h.pending[k] += n
		}
		h.trim()
	}
	h.mu.Unlock()
	if err != nil {
		return fmt.Errorf("inbox history: %w", err)
	}
	return nil
}

func (h *history) write(ctx context.Context, batch map[historyKey]int64) error {
	keys := slices.SortedFunc(maps.Keys(batch), func(a, b historyKey) int {
		return cmp.Or(strings.Compare(a.biz, b.biz), cmp.Compare(a.minute, b.minute), strings.Compare(a.outcome, b.outcome))
	})
	d := dbx.DialectOf(h.db)
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), historyRows)]
		keys = keys[len(chunk):]
		args := make([]any, 0, 4*len(chunk))
		for _, k := range chunk {
			args = append(args, k.biz, time.Unix(k.minute*60, 0).UTC(), k.outcome, batch[k])
		}
		if _, err := tx.ExecContext(ctx, historyUpsert(d, len(chunk)), args...); err != nil {
			return err
		}
	}
	// Cancelling the statements above rolls them back with the transaction. Only a COMMIT
	// whose answer is lost leaves it unknown whether the counts went in.
	h.mu.Lock()
	h.committing = true
	h.mu.Unlock()
	err = tx.Commit()
	h.mu.Lock()
	h.committing = false
	h.commits++
	h.mu.Unlock()
	return err
}

// prune deletes HistoryTable's minutes before before, per biz type over its primary key.
// Each statement deletes at most historyPruneBatch rows.
func (h *history) prune(ctx context.Context, before time.Time) (int64, error) {
	d := dbx.DialectOf(h.db)
	rows, err := h.db.QueryContext(ctx, "SELECT DISTINCT biz_type FROM "+HistoryTable)
	if err != nil {
		return 0, fmt.Errorf("inbox history retention: %w", err)
	}
	var bizTypes []string
	for rows.Next() {
		var b string
		if err := rows.Scan(&b); err != nil {
			rows.Close()
			return 0, fmt.Errorf("inbox history retention: %w", err)
		}
		bizTypes = append(bizTypes, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("inbox history retention: %w", err)
	}
	q := fmt.Sprintf("DELETE FROM %s WHERE biz_type = ? AND minute < ? LIMIT %d", HistoryTable, historyPruneBatch)
	if d.IsPostgres() {
		q = d.Rebind(fmt.Sprintf(`DELETE FROM %[1]s WHERE (biz_type, minute, outcome) IN
 (SELECT biz_type, minute, outcome FROM %[1]s WHERE biz_type = ? AND minute < ? LIMIT %[2]d)`, HistoryTable, historyPruneBatch))
	}
	var total int64
	for _, b := range bizTypes {
		for {
			res, err := h.db.ExecContext(ctx, q, b, before.UTC())
			if err != nil {
				return total, fmt.Errorf("inbox history retention: %w", err)
			}
			n, _ := res.RowsAffected()
			total += n
			if n < historyPruneBatch {
				break
			}
		}
	}
	return total, nil
}

// lastHour returns the deliveries per minute of the hour up to now, the current minute
// last. It covers bizTypes and every biz type this process has counts of. It sums
// HistoryTable's rows, which every router adds to, and this process's counts not written
// yet.
func (h *history) lastHour(ctx context.Context, bizTypes []string, now time.Time) ([]MinuteCount, error) {
	cur := now.Unix() / 60
	first := cur - historyMinutes + 1
	for attempt := 0; ; attempt++ {
		h.mu.Lock()
		busy, commits := h.committing, h.commits
		local := map[historyKey]int64{}
		for _, m := range []map[historyKey]int64{h.pending, h.inflight} {
			for k, n := range m {
				if k.minute >= first && k.minute <= cur {
					local[k] += n
				}
			}
		}
		h.mu.Unlock()
		if busy && attempt < 50 {
			time.Sleep(10 * time.Millisecond) // a COMMIT is under way: wait for its end
			continue
		}
		biz := slices.Clone(bizTypes)
		for k := range local {
			if !slices.Contains(biz, k.biz) {
				biz = append(biz, k.biz)
			}
		}
		stored, err := h.read(ctx, biz, first, cur)
		h.mu.Lock()
		same := !h.committing && h.commits == commits
		h.mu.Unlock()
		if !same && err == nil && attempt < 50 {
			continue // a flush committed while the table was read: it may hold local's inflight
		}
		out := make([]MinuteCount, historyMinutes)
		for i := range out {
			out[i].Minute = time.Unix((first+int64(i))*60, 0).UTC()
		}
		for _, m := range []map[historyKey]int64{stored, local} {
			for k, n := range m {
				out[k.minute-first].add(k.outcome, n)
			}
		}
		return out, err
	}
}

// read sums HistoryTable's rows of bizTypes from minute first to last. It reads each biz
// type as a range of the primary key.
func (h *history) read(ctx context.Context, bizTypes []string, first, last int64) (map[historyKey]int64, error) {
	out := map[historyKey]int64{}
	if len(bizTypes) == 0 {
		return out, nil
	}
	q := "SELECT minute, outcome, n FROM " + HistoryTable + " WHERE biz_type IN (" +
		strings.TrimSuffix(strings.Repeat("?, ", len(bizTypes)), ", ") + ") AND minute >= ? AND minute <= ?"
	args := make([]any, 0, len(bizTypes)+2)
	for _, b := range bizTypes {
		args = append(args, b)
	}
	args = append(args, time.Unix(first*60, 0).UTC(), time.Unix(last*60, 0).UTC())
	rows, err := h.db.QueryContext(ctx, dbx.DialectOf(h.db).Rebind(q), args...)
	if err != nil {
		return out, fmt.Errorf("inbox history: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var minute time.Time
		var k historyKey
		var n int64
		if err := rows.Scan(&minute, &k.outcome, &n); err != nil {
			return out, fmt.Errorf("inbox history: %w", err)
		}
		k.minute = minute.Unix() / 60
		if k.minute >= first && k.minute <= last {
			out[k] += n
		}
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("inbox history: %w", err)
	}
	return out, nil
}

// errNoHistory is what a Metrics without a database answers for its history.
var errNoHistory = errors.New("inbox history: no database")

// FlushHistory adds the deliveries observed and not yet written to HistoryTable, in one
// transaction. After an error they are kept for the next flush.
func (m *Metrics) FlushHistory(ctx context.Context) error {
	if m.history == nil {
		return errNoHistory
	}
	return m.history.flush(ctx)
}

// PruneHistory deletes HistoryTable's minutes before before, in bounded batches, and
// returns how many rows it deleted.
func (m *Metrics) PruneHistory(ctx context.Context, before time.Time) (int64, error) {
	if m.history == nil {
		return 0, errNoHistory
	}
	return m.history.prune(ctx, before)
}

// RunHistory flushes the history every interval until ctx ends. Each flush is bounded by
// its own timeout, not by ctx. Once an hour it deletes the minutes past HistoryRetention.
// When ctx ends, it flushes once more and returns. onErr gets each failure. A nil onErr
// ignores them.
func (m *Metrics) RunHistory(ctx context.Context, every time.Duration, onErr func(error)) {
	if m.history == nil {
		return
	}
	report := func(err error) {
		if err != nil && onErr != nil {
			onErr(err)
		}
	}
	flush := func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), historyFlushTimeout)
		defer cancel()
		report(m.history.flush(fctx))
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			flush()
			return
		case <-t.C:
		}
		flush()
		if time.Since(m.history.lastPrune) >= historyPruneEvery {
			m.history.lastPrune = time.Now()
			pctx, cancel := context.WithTimeout(ctx, historyFlushTimeout)
			_, err := m.history.prune(pctx, time.Now().Add(-HistoryRetention))
			cancel()
			report(err)
		}
	}
}

// LastHour returns the deliveries per minute of the last 60 minutes, the current one last.
// It covers bizTypes and the biz types this process counted. It sums what every router
// wrote to HistoryTable and this process's counts not written yet. Without a database, or
// when the table cannot be read, it returns this process's unwritten counts and the error.
func (m *Metrics) LastHour(ctx context.Context, bizTypes []string, now time.Time) ([]MinuteCount, error) {
	if m.history == nil {
		out := make([]MinuteCount, historyMinutes)
		cur := now.Unix() / 60
		for i := range out {
			out[i].Minute = time.Unix((cur-historyMinutes+1+int64(i))*60, 0).UTC()
		}
		return out, nil
	}
	return m.history.lastHour(ctx, bizTypes, now)
}

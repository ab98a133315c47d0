package metrics

import (
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/pkg/dbx"

	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// DBStats are the database figures behind the gauges, as the background refresh read them.
// The refresh runs at most every dbRefresh, whether a scrape or the operator console asks.
type DBStats struct {
	// At is when they were read. It is zero when they never were, without a database.
	At time.Time
	// InboxRows counts the inbox rows per biz type and status. Its failed rows are the
	// quarantined ones. The rows waiting for a delayed redelivery are in Delayed.
	InboxRows []InboxCount
	// FailedReasons counts the quarantined failed rows per biz type and reason, for the biz
	// types InboxRows has failed rows of. Delayed holds reason 'delayed'.
	FailedReasons []ReasonCount
	// FailedErrors groups the last errors of each biz type's newest failed rows, at most
	// failedErrorRows of them, most frequent first.
	FailedErrors []ErrorCount
	// Delayed counts the rows waiting for a delayed redelivery per biz type, with the
	// earliest next attempt. It lists only biz types that have some.
	Delayed []DelayedCount
	// OutboxRead says that Unpublished and OldestUnpublished were read.
	OutboxRead        bool
	Unpublished       int64
	OldestUnpublished time.Duration // age of the oldest unpublished row when read; 0: none
	// PublishableRead says that OldestPublishable was read. OldestPublishable is the age of
	// the oldest unpublished row since it became publishable: since its creation, or, for a
	// row put back by `router outbox retry` (or committed late), since the first read that
	// found it unpublished.
	PublishableRead   bool
	OldestPublishable time.Duration
	// ParkedRead says that ParkedRefused and ParkedHeld were read.
	ParkedRead    bool
	ParkedRefused int64 // parked events Kafka refuses for good
	ParkedHeld    int64 // parked events held behind one of their key
}

// InboxCount is the number of inbox rows of one biz type and status.
type InboxCount struct {
	BizType string
	Status  string
	Rows    int64
}

// ReasonCount is the number of failed inbox rows of one biz type and reason.
type ReasonCount struct {
	BizType string
	Reason  string // "" for failed rows without a reason
	Rows    int64

	next time.Time // the earliest retry_at of the reason's rows (delayed ones)
}

// DelayedCount is the number of inbox rows of one biz type waiting for a delayed
// redelivery, and when the first of them is due.
type DelayedCount struct {
	BizType string
	Rows    int64
	Next    time.Time // earliest retry_at (UTC); zero when unknown
}

// delayedReason is the reason of a 'failed' row waiting for a delayed redelivery. It is
// engine.ReasonDelayed.
const delayedReason = "delayed"

// splitDelayed moves the rows waiting for a delayed redelivery out of the failed counts
// into Delayed, because they are not quarantined.
func (s *DBStats) splitDelayed() {
	reasons := s.FailedReasons[:0:0]
	for _, r := range s.FailedReasons {
		if r.Reason != delayedReason {
			reasons = append(reasons, r)
			continue
		}
		s.Delayed = append(s.Delayed, DelayedCount{BizType: r.BizType, Rows: r.Rows, Next: r.next})
		for i := range s.InboxRows {
			if c := &s.InboxRows[i]; c.BizType == r.BizType && c.Status == "failed" {
				c.Rows -= r.Rows
			}
		}
	}
	s.FailedReasons = reasons
}

// InvalidateDBStats drops the cached database figures. The next DBStats waits for figures
// read after this call. Call it after an action changed the rows they count.
func (m *Metrics) InvalidateDBStats() {
	if m.db != nil {
		m.db.invalidate()
	}
}

// DBStatsRefresh is how old the cached database figures may get before a read refreshes
// them.
const DBStatsRefresh = dbRefresh

// ErrorCount is the number of a biz type's newest failed rows with one last error.
type ErrorCount struct {
	BizType string
	Error   string // its first failedErrorText bytes, the row's key in it written "…"
	Rows    int64
	Of      int64 // the failed rows read (at most failedErrorRows)
}

// DBStats returns the cached database figures. It starts a refresh in the background when
// they are older than the refresh interval. The first call waits for the first refresh. A
// Metrics without a database returns zero figures.
func (m *Metrics) DBStats() DBStats {
	if m.db == nil {
		return DBStats{}
	}
	return m.db.stats()
}

// failedReasons counts the failed rows by reason, with one query per biz type that has
// failed rows. Each query reads the range of biz_type and 'failed' in the inbox's index on
// biz_type, status and created_at. So it reads the quarantined rows only, never the done
// ones.
func failedReasons(ctx context.Context, db *sql.DB, counts []InboxCount) []ReasonCount {
	var out []ReasonCount
	for _, c := range counts {
		if c.Status != "failed" || c.Rows == 0 {
			continue
		}
		rows, err := db.QueryContext(ctx, dbx.DialectOf(db).Rebind(`SELECT COALESCE(reason, ''), COUNT(*), MIN(retry_at) FROM inbox WHERE biz_type = ? AND status = 'failed' GROUP BY reason`), c.BizType)
		if err != nil {
			continue
		}
		for rows.Next() {
			r := ReasonCount{BizType: c.BizType}
			var next sql.NullTime
			if rows.Scan(&r.Reason, &r.Rows, &next) == nil {
				r.next = next.Time
				out = append(out, r)
			}
		}
		rows.Close()
	}
	return out
}

// failedErrorRows bounds the failed rows whose errors are grouped per biz type.
// failedErrorText bounds the bytes of an error compared, and failedErrorGroups the groups
// kept.
const (
	failedErrorRows   = 1000
	failedErrorText   = 200
	failedErrorGroups = 5
)

// failedErrorQuery reads the key and the start of the last error of a biz type's newest
// failed rows, at most failedErrorRows of them. It reads from the newest end of the range of
// biz_type and 'failed' in the index on biz_type, status and created_at. It reads the rows
// by primary key.
var failedErrorQuery = fmt.Sprintf(`SELECT dedup_key, SUBSTR(COALESCE(last_error, ''), 1, %d) FROM inbox
 WHERE biz_type = ? AND status = 'failed' ORDER BY created_at DESC LIMIT %d`, 2*failedErrorText, failedErrorRows)

// failedErrors groups the last errors of the newest failed rows of each biz type that has
// failed rows. It writes each row's key in its error as "…", so errors that name their
// order group together. It leaves out the notes that begin a poison row's error, for the
// same reason. This happens in Go, because the database's collations differ
// between key and error.
func failedErrors(ctx context.Context, db *sql.DB, counts []InboxCount) []ErrorCount {
	var out []ErrorCount
	for _, c := range counts {
		if c.Status != "failed" || c.Rows == 0 {
			continue
		}
		rows, err := db.QueryContext(ctx, dbx.DialectOf(db).Rebind(failedErrorQuery), c.BizType)
		if err != nil {
			continue
		}
		n := map[string]int64{}
		var read int64
		for rows.Next() {
			var key, e string
			if rows.Scan(&key, &e) != nil {
				continue
			}
			read++
			e = msgsource.WithoutNotes(e) // a poison row's Kafka key and payload id
			if key != "" {
				e = strings.ReplaceAll(e, key, "…")
			}
			n[cutText(e, failedErrorText)]++
		}
		rows.Close()
		var group []ErrorCount
		for e, k := range n {
			group = append(group, ErrorCount{BizType: c.BizType, Error: e, Rows: k, Of: read})
		}
		slices.SortFunc(group, func(a, b ErrorCount) int {
			return cmp.Or(cmp.Compare(b.Rows, a.Rows), strings.Compare(a.Error, b.Error))
		})
		out = append(out, group[:min(len(group), failedErrorGroups)]...)
	}
	return out
}

// cutText cuts s to at most n bytes on a character boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

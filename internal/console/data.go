package console

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/consoleui"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// bizCounts is one biz type's row of the overview.
type bizCounts struct {
	Name                     string
	Plugins                  []string
	Done, Processing, Failed int64
	Reasons                  []metrics.ReasonCount
	Errors                   []metrics.ErrorCount // the newest failed rows' last errors, grouped
	CanReplay                bool                 // a plugin of this router runs it and a replay handler is set
}

// overviewData is the overview page.
type overviewData struct {
	Stats      metrics.DBStats
	StatsAge   time.Duration
	StatsStale bool // older than their refresh interval, so the page says "as of"
	Biz        []bizCounts
	Throughput metrics.Throughput
	LastHour   metrics.MinuteCount
	Chart      consoleui.Chart
	Partitions []metrics.PartitionSummary
	Leases     []leaseRow
	Members    []memberRow
	Replays    []replayRow
	Errors     []string
	// GroupLag is the consumer groups' lag as Kafka holds it, for every member's
	// partitions. GroupLagAge is its age. GroupLagStale says it is older than its refresh
	// interval.
	GroupLag      []groupLagRow
	GroupLagShown bool
	GroupLagAge   time.Duration
	GroupLagStale bool
	Outage        []outageRow // see outage.go
}

type leaseRow struct {
	Shard, Owner string
	Live         bool
	ExpiresIn    time.Duration // negative when the lease expired that long ago
	AcquiredAt   time.Time
	Takeovers    int64
}

type memberRow struct {
	Group, Owner string
	Shards       int
	Live         bool
}

// bizTypes returns the biz types to show, sorted. They are the configured ones and any that
// the inbox holds rows of, such as the biz type of a plugin no longer registered.
func (c *Console) bizTypes(stats metrics.DBStats) []string {
	seen := map[string]bool{}
	var out []string
	for _, b := range c.cfg.BizTypes {
		if !seen[b.Name] {
			seen[b.Name] = true
			out = append(out, b.Name)
		}
	}
	for _, r := range stats.InboxRows {
		if !seen[r.BizType] {
			seen[r.BizType] = true
			out = append(out, r.BizType)
		}
	}
	sort.Strings(out)
	return out
}

func (c *Console) loadOverview(ctx context.Context) overviewData {
	var d overviewData
	now := time.Now()
	if c.cfg.Metrics != nil {
		d.Stats = c.cfg.Metrics.DBStats()
		d.Throughput = c.cfg.Metrics.Throughput()
		d.Partitions = c.cfg.Metrics.Consumers.Partitions()
		sort.Slice(d.Partitions, func(i, j int) bool {
			a, b := d.Partitions[i], d.Partitions[j]
			if a.Group != b.Group {
				return a.Group < b.Group
			}
			if a.Topic != b.Topic {
				return a.Topic < b.Topic
			}
			return a.Partition < b.Partition
		})
	}
	if !d.Stats.At.IsZero() {
		d.StatsAge = now.Sub(d.Stats.At)
		d.StatsStale = d.StatsAge > metrics.DBStatsRefresh
	}
	var minutes []metrics.MinuteCount
	if c.cfg.Metrics != nil {
		// LastHour reads every router's deliveries from inbox_history, and this router's
		// deliveries not written yet.
		var err error
		if minutes, err = c.cfg.Metrics.LastHour(ctx, c.bizTypes(d.Stats), now); err != nil {
			d.Errors = append(d.Errors, err.Error())
		}
	}
	for _, m := range minutes {
		d.LastHour.Processed += m.Processed
		d.LastHour.Duplicate += m.Duplicate
		d.LastHour.Quarantined += m.Quarantined
		d.LastHour.Conflict += m.Conflict
		d.LastHour.Held += m.Held
	}
	d.Chart = consoleui.NewChart(minutes)
	for _, name := range c.bizTypes(d.Stats) {
		b := bizCounts{Name: name, Plugins: c.biz[name].Plugins, CanReplay: c.cfg.Replay != nil && c.biz[name].Name != ""}
		for _, r := range d.Stats.InboxRows {
			if r.BizType != name {
				continue
			}
			switch engine.Status(r.Status) {
			case engine.StatusDone:
				b.Done = r.Rows
			case engine.StatusProcessing:
				b.Processing = r.Rows
			case engine.StatusFailed:
				b.Failed = r.Rows
			}
		}
		for _, r := range d.Stats.FailedReasons {
			if r.BizType == name {
				b.Reasons = append(b.Reasons, r)
			}
		}
		slices.SortFunc(b.Reasons, func(x, y metrics.ReasonCount) int { return int(y.Rows - x.Rows) })
		for _, e := range d.Stats.FailedErrors {
			if e.BizType == name {
				b.Errors = append(b.Errors, e)
			}
		}
		d.Biz = append(d.Biz, b)
	}
	if c.cfg.Lags != nil && len(c.cfg.Groups) > 0 {
		gl := c.groupLag()
		d.GroupLagShown, d.GroupLag = true, gl.Rows
		d.Errors = append(d.Errors, gl.Errors...)
		if !gl.At.IsZero() {
			d.GroupLagAge = time.Since(gl.At)
			d.GroupLagStale = d.GroupLagAge > groupLagRefresh
		}
	}
	d.Outage = c.outageRows(d.Stats)
	var err error
	if d.Leases, err = c.leases(ctx); err != nil {
		d.Errors = append(d.Errors, err.Error())
	}
	if d.Members, err = c.members(ctx); err != nil {
		d.Errors = append(d.Errors, err.Error())
	}
	if d.Replays, err = c.recentReplays(ctx, 0, 5); err != nil {
		d.Errors = append(d.Errors, err.Error())
	}
	return d
}

// leaseQueries read the relay's lease rows. The database's clock judges each row live and
// gives the microseconds it has left. The first query is the MySQL family's, the second
// PostgreSQL's.
var leaseQueries = [2]string{
	`SELECT shard, owner, expires_at > NOW(6), TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at), acquired_at, takeovers
 FROM ` + outbox.LeaseTable + ` ORDER BY shard LIMIT 1024`,
	`SELECT shard, owner, expires_at > LOCALTIMESTAMP, CAST(EXTRACT(EPOCH FROM expires_at - LOCALTIMESTAMP) * 1000000 AS BIGINT), acquired_at, takeovers
 FROM ` + outbox.LeaseTable + ` ORDER BY shard LIMIT 1024`,
}

// leases reads the relay's lease rows, judged live by the database's clock as the relays
// judge them. The table has one row per shard, so it is small and read whole.
func (c *Console) leases(ctx context.Context) ([]leaseRow, error) {
	q := leaseQueries[0]
	if dbx.DialectOf(c.cfg.DB).IsPostgres() {
		q = leaseQueries[1]
	}
	rows, err := c.cfg.DB.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("relay leases: %w", err)
	}
	defer rows.Close()
	var out []leaseRow
	for rows.Next() {
		var l leaseRow
		var us int64
		if err := rows.Scan(&l.Shard, &l.Owner, &l.Live, &us, &l.AcquiredAt, &l.Takeovers); err != nil {
			return nil, fmt.Errorf("relay leases: %w", err)
		}
		l.ExpiresIn = time.Duration(us) * time.Microsecond
		out = append(out, l)
	}
	return out, rows.Err()
}

// members reads the relays registered in a sharded group, one with relay.shards above 1.
func (c *Console) members(ctx context.Context) ([]memberRow, error) {
	rows, err := c.cfg.DB.QueryContext(ctx, `SELECT grp, owner, shards, expires_at > CURRENT_TIMESTAMP(6) FROM `+outbox.MemberTable+` ORDER BY grp, owner LIMIT 1024`)
	if err != nil {
		return nil, fmt.Errorf("relay members: %w", err)
	}
	defer rows.Close()
	var out []memberRow
	for rows.Next() {
		var m memberRow
		if err := rows.Scan(&m.Group, &m.Owner, &m.Shards, &m.Live); err != nil {
			return nil, fmt.Errorf("relay members: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// replayRow is one row of the replay table.
type replayRow struct {
	inboxops.ReplayReport
	Running    bool
	FilterText string
}

// recentReplays reads n rows of the replay table newest first, by its primary key. It
// starts below the id before, or at the newest row when before is 0.
func (c *Console) recentReplays(ctx context.Context, before int64, n int) ([]replayRow, error) {
	q := `SELECT id, biz_type, filter, dry_run, started_at, finished_at, selected, processed, duplicate, quarantined, conflict, outcome, error FROM ` + inboxops.ReplayTable
	var args []any
	if before > 0 {
		q += ` WHERE id < ?`
		args = append(args, before)
	}
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, n)
	rows, err := c.cfg.DB.QueryContext(ctx, dbx.DialectOf(c.cfg.DB).Rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("replays: %w", err)
	}
	defer rows.Close()
	var out []replayRow
	for rows.Next() {
		var r replayRow
		var finished sql.NullTime
		var errText sql.NullString
		if err := rows.Scan(&r.ID, &r.BizType, &r.FilterText, &r.DryRun, &r.StartedAt, &finished, &r.Selected, &r.Processed,
			&r.Duplicates, &r.Quarantined, &r.Conflicts, &r.Outcome, &errText); err != nil {
			return nil, fmt.Errorf("replays: %w", err)
		}
		r.FinishedAt, r.Error, r.Running = finished.Time, errText.String, !finished.Valid
		r.Refused = inboxops.StoredRefused(r.ReplayReport)
		var f inboxops.Filter
		if json.Unmarshal([]byte(r.FilterText), &f) == nil {
			r.Filter = f
			r.FilterText = filterText(f)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// filterText writes a replay's selection as `router replay` flags.
func filterText(f inboxops.Filter) string {
	s := "--biz-type " + f.BizType
	if len(f.Statuses) == 0 {
		s += " --status all"
	}
	for _, st := range f.Statuses {
		s += " --status " + string(st)
	}
	for _, r := range f.Reasons {
		s += " --reason " + string(r)
	}
	if f.OlderThan > 0 {
		s += " --older-than " + f.OlderThan.String()
	}
	for _, k := range f.Keys {
		s += " --order-id " + k
	}
	for _, k := range f.Refs {
		s += " " + k
	}
	if !f.Since.IsZero() {
		s += " --since " + f.Since.UTC().Format(time.RFC3339Nano)
	}
	if !f.Until.IsZero() {
		s += " --until " + f.Until.UTC().Format(time.RFC3339Nano)
	}
	if f.ReplayID > 0 {
		s += fmt.Sprintf(" --replay-id %d", f.ReplayID)
	}
	if f.Limit > 0 {
		s += fmt.Sprintf(" --limit %d", f.Limit)
	}
	return s
}

// groupLagRefresh is how long a read of the consumer groups' lag is served again.
// groupLagWait is how long a page waits for a new read. After that the page shows the
// previous read, with its age.
const (
	groupLagRefresh = 10 * time.Second
	groupLagWait    = 3 * time.Second
)

// groupLagSnapshot is one read of every group's lag.
type groupLagSnapshot struct {
	At      time.Time
	Rows    []groupLagRow
	Errors  []string
	reading chan struct{} // closed when the read in flight ends, nil when none is
}

// groupLagRow is one partition of a group, as Kafka holds it.
type groupLagRow struct {
	Group string
	kafkax.PartitionLag
}

// groupLag returns the groups' lag as read at most groupLagRefresh ago. When the last read
// is older, groupLag starts a read and waits for it groupLagWait at most. The snapshot's At
// gives its age.
func (c *Console) groupLag() groupLagSnapshot {
	if c.cfg.Lags == nil || len(c.cfg.Groups) == 0 {
		return groupLagSnapshot{}
	}
	c.lagMu.Lock()
	if time.Since(c.lag.At) > groupLagRefresh && c.lag.reading == nil {
		done := make(chan struct{})
		c.lag.reading = done
		go func() {
			defer close(done)
			s := groupLagSnapshot{}
			for _, g := range c.cfg.Groups {
				rows, err := c.cfg.Lags.GroupLag(g.Name, g.Topics)
				if err != nil {
					s.Errors = append(s.Errors, fmt.Sprintf("lag of group %s: %v", g.Name, err))
				}
				for _, r := range rows {
					s.Rows = append(s.Rows, groupLagRow{Group: g.Name, PartitionLag: r})
				}
			}
			s.At = time.Now()
			c.lagMu.Lock()
			c.lag = s
			c.lagMu.Unlock()
		}()
	}
	wait := c.lag.reading
	c.lagMu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-time.After(groupLagWait):
		}
	}
	c.lagMu.Lock()
	defer c.lagMu.Unlock()
	s := c.lag
	s.reading = nil
	return s
}

package routercmd

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// genericChecks are what `router verify` checks for every plugin, whether or not it
// declares invariants of its own with inbox.Plugin.Verify. They check what the framework
// promises of any handler. Every inbox row ends processed or quarantined with a reason.
// Every outbox event is published within relay.lag_bound. Every record of the plugin's
// topics is consumed.
type genericChecks struct {
	db       *sql.DB
	plugins  []onceflow.Plugin // the audited plugins
	bare     []onceflow.Plugin // those of them without Verify
	lagBound time.Duration
	keys     []string          // the producer ledgers' keys, from verify --ledger
	lags     *kafkax.LagReader // nil without verify --kafka
}

// ledgerChunk is how many ledger keys one query looks up.
const ledgerChunk = 500

// run makes the checks once. Work still in flight sets Pending. Such work is rows
// processing, events unpublished, ledger keys without an outcome and records not consumed.
// Each of them is a violation too, but for an event unpublished for less than the lag
// bound. `verify --wait` waits while there is work in flight, and reports what is left.
func (c genericChecks) run(ctx context.Context) (inbox.Verification, error) {
	var v inbox.Verification
	rb := dbx.DialectOf(c.db).Rebind
	bizTypes := bizTypesOf(c.plugins)
	slices.Sort(bizTypes)
	args := make([]any, len(bizTypes))
	for i, bt := range bizTypes {
		args[i] = bt
	}
	in := "?" + strings.Repeat(", ?", len(bizTypes)-1)

	// Count the rows still processing and the failed rows without a reason. Both queries
	// read a range of the inbox's index on biz_type and status, never the done rows.
	processing, err := countByBizType(ctx, c.db, rb(`SELECT biz_type, COUNT(*) FROM inbox WHERE biz_type IN (`+in+`) AND status = 'processing' GROUP BY biz_type`), args)
	if err != nil {
		return v, fmt.Errorf("verify: inbox rows processing: %w", err)
	}
	unexplained, err := countByBizType(ctx, c.db, rb(`SELECT biz_type, COUNT(*) FROM inbox WHERE biz_type IN (`+in+`) AND status = 'failed' AND COALESCE(reason, '') = '' GROUP BY biz_type`), args)
	if err != nil {
		return v, fmt.Errorf("verify: failed inbox rows: %w", err)
	}
	total := 0
	for _, bt := range bizTypes {
		if n := processing[bt]; n > 0 {
			total += n
			v.Pending = true
			v.Violations = append(v.Violations, fmt.Sprintf("inbox: %d rows of biz type %s still processing, neither processed nor quarantined (router inbox ls --status processing --biz-type %s lists them)",
				n, safeText(bt), safeText(bt)))
		}
		if n := unexplained[bt]; n > 0 {
			v.Violations = append(v.Violations, fmt.Sprintf("inbox: %d failed rows of biz type %s without a reason", n, safeText(bt)))
		}
	}

	// No row of the whole outbox may stay unpublished for longer than the lag bound.
	var unpublished, stale int64
	if err := c.db.QueryRowContext(ctx, rb(`SELECT COUNT(*), COALESCE(SUM(CASE WHEN created_at < ? THEN 1 ELSE 0 END), 0) FROM outbox WHERE published_at IS NULL`),
		time.Now().Add(-c.lagBound).UTC()).Scan(&unpublished, &stale); err != nil {
		return v, fmt.Errorf("verify: unpublished outbox rows: %w (run `router migrate`)", err)
	}
	v.Pending = v.Pending || unpublished > 0
	if stale > 0 {
		v.Violations = append(v.Violations, fmt.Sprintf("outbox: %d rows unpublished for longer than relay.lag_bound (%s)", stale, c.lagBound))
	}
	v.Summary = fmt.Sprintf("processing_rows=%d unpublished_events=%d", total, unpublished)

	// A plugin may take `router produce`'s input and check nothing of its own. For such a
	// plugin each of the ledger's keys must have a row processed or quarantined.
	for _, p := range c.bare {
		if p.Sampler == nil || len(c.keys) == 0 {
			continue
		}
		lost, examples, err := lostKeys(ctx, c.db, p.BizType, c.keys)
		if err != nil {
			return v, err
		}
		if lost > 0 {
			v.Pending = true
			v.Violations = append(v.Violations, fmt.Sprintf("lost: %d of the ledger's %d keys have no processed or quarantined inbox row of plugin %s (e.g. %s)",
				lost, len(c.keys), p.Name, strings.Join(examples, ", ")))
		}
	}

	// Each plugin's group must have consumed every record of the plugin's topics.
	if c.lags != nil {
		var lag int64
		for _, p := range c.plugins {
			if p.ConsumerGroup == "" || len(p.Topics) == 0 {
				continue
			}
			parts, err := c.lags.GroupLag(p.ConsumerGroup, p.Topics)
			if err != nil {
				return v, fmt.Errorf("verify: consumer lag of plugin %s: %w", p.Name, err)
			}
			var behind int64
			var where []string
			slices.SortFunc(parts, func(a, b kafkax.PartitionLag) int {
				return cmp.Or(cmp.Compare(b.Lag, a.Lag), strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
			})
			for _, pl := range parts {
				if pl.Lag > 0 {
					behind += pl.Lag
					if len(where) < 5 {
						where = append(where, fmt.Sprintf("%s/%d: %d", pl.Topic, pl.Partition, pl.Lag))
					}
				}
			}
			if behind > 0 {
				lag += behind
				v.Pending = true
				v.Violations = append(v.Violations, fmt.Sprintf("kafka: consumer group %s of plugin %s has %d records not consumed (%s)",
					p.ConsumerGroup, p.Name, behind, strings.Join(where, ", ")))
			}
		}
		v.Summary += fmt.Sprintf(" consumer_lag=%d", lag)
	}
	return v, nil
}

// countByBizType reads rows of a biz type and a count into a map.
func countByBizType(ctx context.Context, db *sql.DB, q string, args []any) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var bt string
		var n int
		if err := rows.Scan(&bt, &n); err != nil {
			return nil, err
		}
		out[bt] = n
	}
	return out, rows.Err()
}

// lostKeys counts the keys without an inbox row of bizType that ended. Such a key has no
// row, or a row still processing or waiting for a delayed redelivery. lostKeys returns up
// to five of them.
func lostKeys(ctx context.Context, db *sql.DB, bizType string, keys []string) (int, []string, error) {
	rb := dbx.DialectOf(db).Rebind
	lost := 0
	var examples []string
	for start := 0; start < len(keys); start += ledgerChunk {
		chunk := keys[start:min(start+ledgerChunk, len(keys))]
		args := make([]any, 0, len(chunk)+1)
		args = append(args, bizType)
		for _, k := range chunk {
			args = append(args, k)
		}
		rows, err := db.QueryContext(ctx, rb(`SELECT dedup_key FROM inbox WHERE biz_type = ? AND dedup_key IN (?`+strings.Repeat(", ?", len(chunk)-1)+`)
 AND (status = 'done' OR (status = 'failed' AND COALESCE(reason, '') <> ?))`), append(args, string(engine.ReasonDelayed))...)
		if err != nil {
			return 0, nil, fmt.Errorf("verify: ledger keys: %w", err)
		}
		ended := map[string]bool{}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return 0, nil, fmt.Errorf("verify: ledger keys: %w", err)
			}
			ended[k] = true
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return 0, nil, fmt.Errorf("verify: ledger keys: %w", err)
		}
		for _, k := range chunk {
			if !ended[k] {
				lost++
				if len(examples) < 5 {
					examples = append(examples, safeText(k))
				}
			}
		}
	}
	return lost, examples, nil
}

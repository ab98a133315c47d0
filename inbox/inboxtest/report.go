package inboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Report is what a Run did.
type Report struct {
	DB      Database // the database the run used (still open until the test ends)
	BizType string   // the inbox's biz type and table
	Table   string

	Keys       []string                   // the business keys delivered, in order
	Deliveries int                        // deliveries made, poison included
	Outcomes   map[engine.Outcome]int     // recorded outcomes, poison included
	Results    map[string][]engine.Result // each key's outcomes, in the order they finished
	Poison     [][]engine.Result          // each Options.Poison message's outcomes
	Errors     []error                    // deliveries whose outcome was not recorded
	Rollbacks  int                        // transactions rolled back by Options.Rollbacks
	Batch      engine.BatchStats          // the Batcher's counters (Options.Grouped)

	opts Options
}

func (r *Report) String() string {
	outcomes := make([]string, 0, len(r.Outcomes))
	for o, n := range r.Outcomes {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", o, n))
	}
	sort.Strings(outcomes)
	mode := "one delivery per transaction"
	if r.opts.Grouped {
		mode = fmt.Sprintf("group commit: %d deliveries in %d batches, %d alone", r.Batch.Batched, r.Batch.Batches, r.Batch.Fallbacks)
	}
	return fmt.Sprintf("%d keys × (%d at once + %d redeliveries), %d poison, %s: %d deliveries (%s), %d not recorded, %d rollbacks injected",
		len(r.Keys), r.opts.Concurrent, r.opts.Redeliveries, len(r.opts.Poison), mode, r.Deliveries,
		strings.Join(outcomes, ", "), len(r.Errors), r.Rollbacks)
}

// Counter counts the effects of business key key in db. Effects are rows, events, calls
// recorded by a fake service and the like.
type Counter func(ctx context.Context, db *sql.DB, key string) (int, error)

// CountQuery counts with query, which takes the key as its one argument and returns one
// number, as "SELECT COUNT(*) FROM points_credit WHERE order_id = ?" does. Write '?'
// whatever the database, because the query is rebound for PostgreSQL.
func CountQuery(query string) Counter {
	return func(ctx context.Context, db *sql.DB, key string) (int, error) {
		var n int
		if err := db.QueryRowContext(ctx, dbx.DialectOf(db).Rebind(query), key).Scan(&n); err != nil {
			return 0, fmt.Errorf("%s: %w", query, err)
		}
		return n, nil
	}
}

// CountEvents counts the events of type eventType the handler stored for key in the outbox
// table "outbox". An event's Kafka key, outbox.Event.Key, must be the business key.
func CountEvents(eventType string) Counter {
	return func(ctx context.Context, db *sql.DB, key string) (int, error) {
		var n int
		err := db.QueryRowContext(ctx, dbx.DialectOf(db).Rebind("SELECT COUNT(*) FROM outbox WHERE msg_key = ? AND event_type = ?"), key, eventType).Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("count %s events in the outbox: %w", eventType, err)
		}
		return n, nil
	}
}

// maxShown bounds the problems OncePerKey lists.
const maxShown = 20

// OncePerKey checks the run against the inbox's promise. count counts one key's effect.
//
//   - Every delivery's outcome was recorded.
//   - Each poison message was quarantined. Its redelivery was held as a duplicate of the
//     quarantined row. count is 0 for the poison messages whose key Decode read.
//   - Each key was processed exactly once, every other delivery of it was a duplicate, and
//     its inbox row is done.
//   - count is exactly 1 for each key.
//
// OncePerKey returns nil, or an error listing at most 20 of the problems found.
func (r *Report) OncePerKey(count Counter) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for _, err := range r.Errors {
		add("%v", err)
	}
	for j, results := range r.Poison {
		for i, res := range results {
			quarantined := res.Outcome == engine.OutcomeQuarantined || (i > 0 && res.Outcome == engine.OutcomeHeld)
			if !quarantined {
				add("poison message %d, delivery %d: %s, want quarantined", j, i+1, describe(res))
			}
			if i > 0 || res.Key == "" || strings.HasPrefix(res.Key, "poison:") {
				continue // not decoded: no key to count
			}
			switch n, err := count(ctx, r.DB.DB, res.Key); {
			case err != nil:
				add("poison message %d (key %s): count its effects: %v", j, res.Key, err)
			case n != 0:
				add("poison message %d (key %s): %d effects, want 0", j, res.Key, n)
			}
		}
	}
	for _, key := range r.Keys {
		processed := 0
		for _, res := range r.Results[key] {
			switch {
			case res.Key != key:
				add("key %s: Decode read key %q from its message (Options.Message must carry the key it is given)", key, res.Key)
			case res.Outcome == engine.OutcomeProcessed:
				processed++
			case res.Outcome == engine.OutcomeDuplicate:
			default:
				add("key %s: %s", key, describe(res))
			}
		}
		if processed != 1 {
			add("key %s: processed %d times, want 1", key, processed)
		}
		var status string
		err := r.DB.DB.QueryRowContext(ctx, dbx.DialectOf(r.DB.DB).Rebind(fmt.Sprintf("SELECT status FROM %s WHERE biz_type = ? AND dedup_key = ?", r.Table)), r.BizType, key).Scan(&status)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			add("key %s: no inbox row", key)
		case err != nil:
			add("key %s: read its inbox row: %v", key, err)
		case status != string(engine.StatusDone):
			add("key %s: inbox row %s, want done", key, status)
		}
		switch n, err := count(ctx, r.DB.DB, key); {
		case err != nil:
			add("key %s: count its effects: %v", key, err)
		case n != 1:
			add("key %s: %d effects, want 1", key, n)
		}
	}
	if len(problems) == 0 {
		return nil
	}
	shown := problems
	if len(shown) > maxShown {
		shown = shown[:maxShown]
	}
	more := ""
	if len(problems) > maxShown {
		more = fmt.Sprintf("\n  ... and %d more", len(problems)-maxShown)
	}
	return fmt.Errorf("inboxtest: not exactly once per key (%s): %d problems:\n  %s%s", r, len(problems), strings.Join(shown, "\n  "), more)
}

func describe(res engine.Result) string {
	s := string(res.Outcome)
	if res.Reason != "" {
		s += " (" + string(res.Reason) + ")"
	}
	if res.Err != nil {
		s += ": " + res.Err.Error()
	}
	return s
}

// AssertOncePerKey fails t unless r.OncePerKey(count) finds nothing wrong.
func AssertOncePerKey(t testing.TB, r *Report, count Counter) {
	t.Helper()
	if err := r.OncePerKey(count); err != nil {
		t.Fatal(err)
	}
}

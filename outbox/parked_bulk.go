package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Chosen is what a Selection chooses among the parked events.
type Chosen struct {
	Refused int64       // refused events chosen
	Held    int64       // events held behind them, released with them
	First   []ParkedRow // the first refused events chosen, in id order, without payloads
}

// Choose counts the refused parked events sel chooses and the events held behind them. It
// returns the first limit of those refused events too.
func (p *Parked) Choose(ctx context.Context, sel Selection, limit int) (Chosen, error) {
	where, args, err := p.selection(sel, "p.")
	if err != nil {
		return Chosen{}, err
	}
	var c Chosen
	q := `SELECT COUNT(*), (SELECT COUNT(*) FROM ` + p.table + ` h JOIN ` + p.table + ` p ON h.held_behind = p.event_id WHERE ` + where + `)
 FROM ` + p.table + ` p WHERE ` + where
	if err := p.db.QueryRowContext(ctx, p.dl.Rebind(q), append(slices.Clone(args), args...)...).Scan(&c.Refused, &c.Held); err != nil {
		return Chosen{}, fmt.Errorf("count parked outbox events: %w", err)
	}
	if limit > 0 && c.Refused > 0 {
		q := fmt.Sprintf(parkedSelect, "''", p.table, p.table) + " WHERE " + where + " ORDER BY p.id LIMIT " + strconv.Itoa(limit)
		if c.First, err = p.query(ctx, q, args...); err != nil {
			return Chosen{}, err
		}
	}
	return c, nil
}

// selection is the condition on the parked table, aliased by prefix, that chooses the
// refused events of sel, and its arguments.
func (p *Parked) selection(sel Selection, prefix string) (string, []any, error) {
	if sel.Reason == ReasonHeld {
		return "", nil, fmt.Errorf("%w: reason %q: held events are released with the event they wait behind", ErrBadRef, sel.Reason)
	}
	where := prefix + "held_behind IS NULL"
	var args []any
	if sel.Topic != "" {
		where += " AND " + prefix + "topic = ?"
		args = append(args, sel.Topic)
	}
	if sel.Reason != "" {
		where += " AND " + prefix + "reason = ?"
		args = append(args, sel.Reason)
	}
	return where, args, nil
}

// BulkRelease is what RetrySelected or DropSelected did.
type BulkRelease struct {
	Released int // refused events retried, or dropped
	// Moved is how many events went back into the outbox. On retry they are the refused
	// events and those held behind them. On drop they are those held behind them.
	Moved   int
	Batches int // transactions committed
}

// bulkBatch is how many refused events one transaction of RetrySelected or DropSelected
// releases, each with the events held behind it. Tests lower it.
var bulkBatch = 1000

// RetrySelected moves the refused parked events sel chooses back into the outbox, each with
// the events held behind it, with their original ids. The relay then publishes them in
// their original order. It goes through them in id order, a batch of refused events per
// transaction, with set-based statements. Each batch locks its refused events as Retry
// does, so a relay holding more events of their keys behind them either sees them gone or
// has its held events moved with them. Events of a key still parked stay behind it, and a
// key's events go back together. progress, when not nil, is called after each batch with
// the totals so far. On an error, the batches before it stay committed and their totals are
// returned with it.
func (p *Parked) RetrySelected(ctx context.Context, sel Selection, progress func(BulkRelease)) (BulkRelease, error) {
	return p.releaseSelected(ctx, sel, true, progress)
}

// DropSelected deletes the refused parked events sel chooses for good and moves the events
// held behind them back into the outbox, in batches as RetrySelected does.
func (p *Parked) DropSelected(ctx context.Context, sel Selection, progress func(BulkRelease)) (BulkRelease, error) {
	return p.releaseSelected(ctx, sel, false, progress)
}

func (p *Parked) releaseSelected(ctx context.Context, sel Selection, retry bool, progress func(BulkRelease)) (BulkRelease, error) {
	where, args, err := p.selection(sel, "")
	if err != nil {
		return BulkRelease{}, err
	}
	heads := p.dl.Rebind(`SELECT id, event_id FROM ` + p.table + ` WHERE ` + where + ` AND id > ? ORDER BY id LIMIT ` + strconv.Itoa(bulkBatch) + ` FOR UPDATE`)
	var total BulkRelease
	after := int64(0)
	for {
		var released, moved int
		var last int64
		var err error
		// A batch that meets a deadlock or a lock wait timeout, with the relay or the
		// writers, was rolled back and runs again.
		for attempt := 1; ; attempt++ {
			err = dbx.InTx(ctx, p.db, func(tx *sql.Tx) error {
				var err error
				released, moved, last, err = p.releaseBatch(ctx, tx, heads, append(slices.Clone(args), after), retry)
				return err
			})
			if err == nil || !dbx.IsLockConflict(err) || attempt == 5 {
				break
			}
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
			}
		}
		if err != nil {
			return total, err
		}
		after = last
		if released == 0 {
			return total, nil
		}
		total.Released += released
		total.Moved += moved
		total.Batches++
		if progress != nil {
			progress(total)
		}
	}
}

// releaseBatch releases, in tx, the refused events the locking read heads returns, each
// with the events held behind it. It returns how many refused events it released, how many
// events went back into the outbox and the last refused event's id.
func (p *Parked) releaseBatch(ctx context.Context, tx *sql.Tx, heads string, args []any, retry bool) (released, moved int, last int64, err error) {
	rows, err := tx.QueryContext(ctx, heads, args...)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("lock parked events: %w", err)
	}
	var ids []int64
	var eventIDs []string
	for rows.Next() {
		var id int64
		var eventID string
		if err := rows.Scan(&id, &eventID); err != nil {
			rows.Close()
			return 0, 0, 0, fmt.Errorf("lock parked events: %w", err)
		}
		ids, eventIDs = append(ids, id), append(eventIDs, eventID)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, 0, fmt.Errorf("lock parked events: %w", err)
	}
	if len(ids) == 0 {
		return 0, 0, 0, nil
	}
	last = ids[len(ids)-1]
	cond, cargs := p.dl.strIn("held_behind", eventIDs)
	rows, err = tx.QueryContext(ctx, p.dl.Rebind(`SELECT id FROM `+p.table+` WHERE `+cond+` FOR UPDATE`), cargs...)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("lock events held behind parked events: %w", err)
	}
	var held []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, 0, 0, fmt.Errorf("lock events held behind parked events: %w", err)
		}
		held = append(held, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, 0, fmt.Errorf("lock events held behind parked events: %w", err)
	}
	all := append(slices.Clone(ids), held...)
	slices.Sort(all)
	move := held
	if retry {
		move = all
	} else {
		slices.Sort(move)
	}
	if len(move) > 0 {
		n, err := p.copyBack(ctx, tx, move)
		if err != nil {
			if dbx.IsDuplicate(err) {
				return 0, 0, 0, fmt.Errorf("outbox: move parked events %d..%d (or one held behind them) back: an id or event id is in %s already: %w", ids[0], last, p.outbox, err)
			}
			return 0, 0, 0, err
		}
		if n != int64(len(move)) {
			return 0, 0, 0, fmt.Errorf("outbox: %d parked events to move back but %d moved; nothing changed", len(move), n)
		}
	}
	cond, dargs, _ := p.dl.idMatch(all)
	res, err := tx.ExecContext(ctx, p.dl.Rebind(`DELETE FROM `+p.table+` WHERE `+cond), dargs...)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("remove released events from %s: %w", p.table, err)
	}
	if n, _ := res.RowsAffected(); n != int64(len(all)) {
		return 0, 0, 0, errors.New("outbox: parked events changed while they were released; nothing changed")
	}
	return len(ids), len(move), last, nil
}

// copyChunk is the most parked rows copyBack reads at once, and copyBytes about the most
// payload bytes one of its INSERT statements carries.
const (
	copyChunk = 500
	copyBytes = 4 << 20
)

// copyBack copies the parked rows with ids, ascending, into the outbox in tx, with all their
// columns, and returns how many it inserted. On PostgreSQL it is one INSERT … SELECT. On
// the MySQL family an INSERT … SELECT into the outbox takes InnoDB's table-level AUTO-INC
// lock for the whole statement. Every writer's insert then waits for it, and one that holds
// a row lock the statement needs deadlocks with it. So copyBack reads the rows and inserts
// them with INSERT … VALUES, which takes no such lock.
func (p *Parked) copyBack(ctx context.Context, tx *sql.Tx, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	if p.dl.IsPostgres() {
		cond, args, _ := p.dl.idMatch(ids)
		res, err := tx.ExecContext(ctx, p.dl.Rebind(`INSERT INTO `+p.outbox+` (`+outboxColumns+`) SELECT `+outboxColumns+` FROM `+p.table+` WHERE `+cond), args...)
		if err != nil {
			return 0, fmt.Errorf("move parked events back into %s: %w", p.outbox, err)
		}
		return res.RowsAffected()
	}
	const width = 9 // the columns of outboxColumns
	var total int64
	for start := 0; start < len(ids); start += copyChunk {
		chunk := ids[start:min(start+copyChunk, len(ids))]
		cond, args, _ := p.dl.idMatch(chunk)
		rows, err := tx.QueryContext(ctx, `SELECT `+outboxColumns+` FROM `+p.table+` WHERE `+cond+` ORDER BY id`, args...)
		if err != nil {
			return total, fmt.Errorf("read parked events: %w", err)
		}
		var vals [][]any
		for rows.Next() {
			v := make([]any, width)
			var (
				id                       int64
				eventID, typ, topic, key string
				payload                  []byte
				headers, traceParent     sql.NullString
				createdAt                time.Time
			)
			if err := rows.Scan(&id, &eventID, &typ, &topic, &key, &payload, &headers, &createdAt, &traceParent); err != nil {
				rows.Close()
				return total, fmt.Errorf("read parked events: %w", err)
			}
			v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8] = id, eventID, typ, topic, key, payload, headers, createdAt, traceParent
			vals = append(vals, v)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("read parked events: %w", err)
		}
		for len(vals) > 0 {
			n, size := 0, 0
			for n < len(vals) && (n == 0 || size < copyBytes) {
				size += len(vals[n][5].([]byte))
				n++
			}
			q := `INSERT INTO ` + p.outbox + ` (` + outboxColumns + `) VALUES (?` + strings.Repeat(", ?", width-1) + `)` +
				strings.Repeat(", (?"+strings.Repeat(", ?", width-1)+")", n-1)
			args := make([]any, 0, n*width)
			for _, v := range vals[:n] {
				args = append(args, v...)
			}
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return total, fmt.Errorf("move parked events back into %s: %w", p.outbox, err)
			}
			k, _ := res.RowsAffected()
			total += k
			vals = vals[n:]
		}
	}
	return total, nil
}

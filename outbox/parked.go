package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Reasons a row is parked, stored in outbox_parked.reason.
const (
	ReasonUnknownTopic  = "unknown_topic"  // the topic does not exist, confirmed with a metadata refresh
	ReasonTooLarge      = "too_large"      // larger than the producer's or the broker's limit
	ReasonInvalidRecord = "invalid_record" // the broker rejects the record as invalid or corrupt, or its topic as invalid
	ReasonUnauthorized  = "unauthorized"   // writing to the topic is not authorized
	ReasonHeld          = "held"           // waits behind a parked event of the same key
)

// ErrNotParked is returned by the Parked store for a reference that names no parked event.
var ErrNotParked = errors.New("outbox: no parked event")

// ErrBadRef is returned for a reference that is neither an outbox id nor an event id, or
// that names two parked events.
var ErrBadRef = errors.New("outbox: bad parked event reference")

// ErrHeld is returned by Retry and Drop for an event that is held behind another one. It is
// released with that one.
var ErrHeld = errors.New("outbox: event is held behind another parked event")

// ParkedRow is an outbox event the relay parked. Either Kafka refused it for good, and
// Reason and Error say why. Or it waits behind such an event of the same key. Its Reason is
// then "held", and HeldBehind is the id of that event.
type ParkedRow struct {
	ID         int64             `json:"id"` // its outbox id, which it gets back on retry
	EventID    string            `json:"event_id"`
	Type       string            `json:"event_type"`
	Topic      string            `json:"topic"`
	Key        string            `json:"key"`
	Payload    []byte            `json:"-"`
	Size       int               `json:"payload_bytes"`
	Headers    map[string]string `json:"headers,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	Reason     string            `json:"reason"`
	Error      string            `json:"error"`
	HeldBehind string            `json:"held_behind,omitempty"`
	ParkedAt   time.Time         `json:"parked_at"`
	Holding    int               `json:"holding"` // events held behind this one
}

// Release is what Retry or Drop did.
type Release struct {
	Event ParkedRow // the parked event retried or dropped
	// Moved is how many events went back into the outbox. On retry they are the event and
	// those held behind it. On drop they are those held behind it.
	Moved int
}

// Parked is the store of parked events. The relay moves them there. Operators list, retry
// and drop them with `router outbox ls|show|retry|drop`.
type Parked struct {
	db     *sql.DB
	dl     sqlText // the pool's dialect
	table  string  // the parked table, named outbox table + "_parked"
	outbox string
}

// parkedTable is the table of parked rows of outbox table t.
func parkedTable(t string) string { return t + "_parked" }

// outboxColumns are the columns a row keeps when it moves between outbox and the parked
// table. key_hash is computed, and published_at stays NULL.
const outboxColumns = "id, event_id, event_type, topic, msg_key, payload, headers, created_at, trace_parent"

// NewParked opens the parked events of outbox table table, "outbox" by default. Migration
// 00010 creates outbox_parked.
func NewParked(db *sql.DB, table string) (*Parked, error) {
	if db == nil {
		return nil, errors.New("outbox: db is required")
	}
	if table == "" {
		table = "outbox"
	}
	if err := dbx.CheckIdent("outbox table", table); err != nil {
		return nil, err
	}
	return &Parked{db: db, dl: sqlText{dbx.DialectOf(db)}, table: parkedTable(table), outbox: table}, nil
}

// Count returns how many events are parked. refused counts the refused events at the head of
// their keys, and held the events held behind them.
func (p *Parked) Count(ctx context.Context) (refused, held int64, err error) {
	err = p.db.QueryRowContext(ctx, `SELECT COUNT(CASE WHEN held_behind IS NULL THEN 1 END), COUNT(held_behind) FROM `+p.table).Scan(&refused, &held)
	if err != nil {
		return 0, 0, fmt.Errorf("count parked outbox events: %w", err)
	}
	return refused, held, nil
}

const parkedSelect = `SELECT p.id, p.event_id, p.event_type, p.topic, p.msg_key, %s, LENGTH(p.payload), p.headers, p.created_at,
 p.reason, p.error, COALESCE(p.held_behind, ''), p.parked_at,
 (SELECT COUNT(*) FROM %s h WHERE h.held_behind = p.event_id)
 FROM %s p`

// List returns parked events without payloads in id order, their order in the outbox.
// limit 0 returns all.
func (p *Parked) List(ctx context.Context, limit int) ([]ParkedRow, error) {
	q := fmt.Sprintf(parkedSelect, "''", p.table, p.table) + " ORDER BY p.id"
	if limit > 0 {
		q += " LIMIT " + strconv.Itoa(limit)
	}
	return p.query(ctx, q)
}

// Selection chooses refused parked events by topic and reason. It never chooses held ones,
// which are released with the event they wait behind. The zero Selection chooses all.
type Selection struct {
	Topic  string // "" for any
	Reason string // one of the Reason constants but ReasonHeld, "" for any
}

// Refused returns the refused parked events sel chooses, in id order, without payloads.
func (p *Parked) Refused(ctx context.Context, sel Selection) ([]ParkedRow, error) {
	where, args, err := p.selection(sel, "p.")
	if err != nil {
		return nil, err
	}
	return p.query(ctx, fmt.Sprintf(parkedSelect, "''", p.table, p.table)+" WHERE "+where+" ORDER BY p.id", args...)
}

// Get returns one parked event with its payload. ref is its outbox id or its event id.
func (p *Parked) Get(ctx context.Context, ref string) (ParkedRow, error) {
	cond, args, err := refMatch(ref, "p.")
	if err != nil {
		return ParkedRow{}, err
	}
	rows, err := p.query(ctx, fmt.Sprintf(parkedSelect, "p.payload", p.table, p.table)+" WHERE "+cond, args...)
	if err != nil {
		return ParkedRow{}, err
	}
	return oneRow(rows, ref)
}

func (p *Parked) query(ctx context.Context, q string, args ...any) ([]ParkedRow, error) {
	rows, err := p.db.QueryContext(ctx, p.dl.Rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("read parked outbox events: %w", err)
	}
	defer rows.Close()
	var out []ParkedRow
	for rows.Next() {
		var (
			r       ParkedRow
			headers sql.NullString
		)
		if err := rows.Scan(&r.ID, &r.EventID, &r.Type, &r.Topic, &r.Key, &r.Payload, &r.Size, &headers, &r.CreatedAt,
			&r.Reason, &r.Error, &r.HeldBehind, &r.ParkedAt, &r.Holding); err != nil {
			return nil, fmt.Errorf("read parked outbox events: %w", err)
		}
		if headers.Valid && headers.String != "" {
			if err := json.Unmarshal([]byte(headers.String), &r.Headers); err != nil {
				return nil, fmt.Errorf("parked outbox event %s: headers: %w", r.EventID, err)
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read parked outbox events: %w", err)
	}
	return out, nil
}

// refMatch returns a condition matching a parked row by outbox id, in digits, or by event id.
func refMatch(ref, prefix string) (string, []any, error) {
	if ref == "" || len(ref) > 36 {
		return "", nil, fmt.Errorf("%w: %q is neither an outbox id nor an event id (1..36 bytes)", ErrBadRef, ref)
	}
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil && id > 0 && strconv.FormatInt(id, 10) == ref {
		// An event id may be all digits too. Both then match, and two matches are refused.
		return "(" + prefix + "id = ? OR " + prefix + "event_id = ?)", []any{id, ref}, nil
	}
	return prefix + "event_id = ?", []any{ref}, nil
}

func oneRow(rows []ParkedRow, ref string) (ParkedRow, error) {
	switch len(rows) {
	case 0:
		return ParkedRow{}, fmt.Errorf("%w with outbox id or event id %q", ErrNotParked, ref)
	case 1:
		return rows[0], nil
	}
	return ParkedRow{}, fmt.Errorf("%w: %q matches two parked events (outbox ids %d and %d), one by outbox id, one by event id: name it by its event id", ErrBadRef, ref, rows[0].ID, rows[1].ID)
}

// Retry moves a parked event and the events held behind it back into the outbox with their
// original ids. The relay then publishes them again in their original order. ref is the
// parked event's outbox id or event id. Retry refuses a held event with ErrHeld. Retry the
// event it waits behind instead.
func (p *Parked) Retry(ctx context.Context, ref string) (Release, error) {
	return p.release(ctx, ref, true)
}

// Drop deletes a parked event for good and moves the events held behind it back into the
// outbox. The relay then publishes them in order.
func (p *Parked) Drop(ctx context.Context, ref string) (Release, error) {
	return p.release(ctx, ref, false)
}

func (p *Parked) release(ctx context.Context, ref string, retry bool) (Release, error) {
	head, err := p.Get(ctx, ref)
	if err != nil {
		return Release{}, err
	}
	if head.HeldBehind != "" {
		return Release{}, fmt.Errorf("%w: event %s waits behind %s (retry or drop that one)", ErrHeld, head.EventID, head.HeldBehind)
	}
	var rel Release
	err = dbx.InTx(ctx, p.db, func(tx *sql.Tx) error {
		// The lock on the parked event serialises this with a relay that is holding more of
		// its key's events behind it, in relayBase.park. Either those events move with it,
		// or the relay finds it gone and leaves them in the outbox.
		var held sql.NullString
		err := tx.QueryRowContext(ctx, p.dl.Rebind(`SELECT held_behind FROM `+p.table+` WHERE event_id = ? FOR UPDATE`), head.EventID).Scan(&held)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w with event id %q (released meanwhile)", ErrNotParked, head.EventID)
		}
		if err != nil {
			return fmt.Errorf("lock parked event %s: %w", head.EventID, err)
		}
		if held.Valid {
			return fmt.Errorf("%w: event %s waits behind %s", ErrHeld, head.EventID, held.String)
		}
		which := `held_behind = ?`
		if retry {
			which = `(event_id = ? OR held_behind = ?)`
		}
		args := []any{head.EventID}
		if retry {
			args = append(args, head.EventID)
		}
		ids, err := p.ids(ctx, tx, which, args)
		if err != nil {
			return err
		}
		moved, err := p.copyBack(ctx, tx, ids)
		if err != nil {
			if dbx.IsDuplicate(err) {
				return fmt.Errorf("outbox: move event %s (or one held behind it) back: its id or event id is in %s already: %w", head.EventID, p.outbox, err)
			}
			return err
		}
		if !retry {
			if _, err := tx.ExecContext(ctx, p.dl.Rebind(`DELETE FROM `+p.table+` WHERE event_id = ?`), head.EventID); err != nil {
				return fmt.Errorf("drop parked event %s: %w", head.EventID, err)
			}
		}
		res, err := tx.ExecContext(ctx, p.dl.Rebind(`DELETE FROM `+p.table+` WHERE `+which), args...)
		if err != nil {
			return fmt.Errorf("remove released events from %s: %w", p.table, err)
		}
		if n, _ := res.RowsAffected(); n != moved {
			return fmt.Errorf("outbox: %d parked events moved back but %d removed; nothing changed", moved, n)
		}
		rel = Release{Event: head, Moved: int(moved)}
		return nil
	})
	return rel, err
}

// ids returns the ids of the parked rows matching which, with args, in id order.
func (p *Parked) ids(ctx context.Context, tx *sql.Tx, which string, args []any) ([]int64, error) {
	rows, err := tx.QueryContext(ctx, p.dl.Rebind(`SELECT id FROM `+p.table+` WHERE `+which+` ORDER BY id`), args...)
	if err != nil {
		return nil, fmt.Errorf("read parked events: %w", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("read parked events: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// parkEntry is a row of a batch the relay moves to the parked table.
type parkEntry struct {
	row    outRow
	reason string
	err    string // the refusal, when reason is not held
	behind string // the event a held row waits behind
	// existing says that behind was parked before this batch. It may have been retried or
	// dropped meanwhile, and park checks that under a lock.
	existing bool
}

// parkedKeys reads the keys that have parked events, each with the event its later events
// wait behind. The table is small, because it holds only refused events and the later
// events of their keys.
func (r *relayBase) parkedKeys(ctx context.Context, q queryer) (map[string]string, error) {
	r.hook("parked-keys")
	rows, err := q.QueryContext(ctx, r.q.parkedKeys)
	if err != nil {
		return nil, fmt.Errorf("read parked outbox keys (migration 00010 creates %s): %w", parkedTable(r.cfg.Table), err)
	}
	defer rows.Close()
	var keys map[string]string
	for rows.Next() {
		var key, head string
		if err := rows.Scan(&key, &head); err != nil {
			return nil, fmt.Errorf("read parked outbox keys: %w", err)
		}
		if keys == nil {
			keys = map[string]string{}
		}
		if _, ok := keys[key]; !ok { // rows come in id order, so this is the first head of a key
			keys[key] = head
		}
	}
	return keys, rows.Err()
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// park moves entries out of the outbox into the parked table in tx. It uses INSERT … SELECT
// and DELETE, so the rows keep their ids and columns. Held rows behind an event parked
// before this batch move only if that event is still parked. park checks that under the
// event's row lock, which Retry and Drop take too. Otherwise the held rows stay in the
// outbox, and park returns their keys in kept. The caller leaves those keys' rows for the
// next batch.
func (r *relayBase) park(ctx context.Context, tx *sql.Tx, entries []parkEntry) (moved []parkEntry, kept map[string]bool, err error) {
	if len(entries) == 0 {
		return nil, nil, nil
	}
	pt := parkedTable(r.cfg.Table)
	var existing []string
	seen := map[string]bool{}
	for _, e := range entries {
		if e.existing && !seen[e.behind] {
			seen[e.behind] = true
			existing = append(existing, e.behind)
		}
	}
	if len(existing) > 0 {
		cond, args := r.dl.strIn("event_id", existing)
		rows, err := tx.QueryContext(ctx, r.dl.Rebind(`SELECT event_id FROM `+pt+` WHERE held_behind IS NULL AND `+cond+` FOR UPDATE`), args...)
		if err != nil {
			return nil, nil, fmt.Errorf("lock parked events: %w", err)
		}
		still := map[string]bool{}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, nil, fmt.Errorf("lock parked events: %w", err)
			}
			still[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("lock parked events: %w", err)
		}
		for _, e := range entries {
			if e.existing && !still[e.behind] {
				if kept == nil {
					kept = map[string]bool{}
				}
				kept[e.row.key] = true
			}
		}
	}
	// Held rows are inserted with one statement per event they wait behind. Refused rows are
	// inserted one statement each.
	insert := `INSERT INTO ` + pt + ` (` + outboxColumns + `, reason, error, held_behind) SELECT ` + outboxColumns +
		`, ?, ?, ? FROM ` + r.cfg.Table + ` WHERE published_at IS NULL AND `
	groups := map[string][]int64{}
	var order []string
	var inserted int64
	var ids []int64
	for _, e := range entries {
		if kept[e.row.key] {
			continue
		}
		moved = append(moved, e)
		ids = append(ids, e.row.id)
		if e.reason == ReasonHeld {
			if _, ok := groups[e.behind]; !ok {
				order = append(order, e.behind)
			}
			groups[e.behind] = append(groups[e.behind], e.row.id)
			continue
		}
		res, err := tx.ExecContext(ctx, r.dl.Rebind(insert+"id = ?"), e.reason, e.err, nil, e.row.id)
		if err != nil {
			return nil, nil, fmt.Errorf("park outbox event %s (topic %s, key %q): %w", e.row.eventID, e.row.topic, e.row.key, err)
		}
		n, _ := res.RowsAffected()
		inserted += n
	}
	for _, behind := range order {
		group := groups[behind]
		cond, args := r.dl.idIn("id", group)
		var key string
		for _, e := range moved {
			if e.behind == behind {
				key = e.row.key
				break
			}
		}
		msg := fmt.Sprintf("held: waits behind parked event %s of the same key %q", behind, key)
		res, err := tx.ExecContext(ctx, r.dl.Rebind(insert+cond), append([]any{ReasonHeld, msg, behind}, args...)...)
		if err != nil {
			return nil, nil, fmt.Errorf("hold %d outbox events behind %s: %w", len(group), behind, err)
		}
		n, _ := res.RowsAffected()
		inserted += n
	}
	if len(ids) == 0 {
		return nil, kept, nil
	}
	cond, args := r.dl.idIn("id", ids)
	res, err := tx.ExecContext(ctx, r.dl.Rebind(`DELETE FROM `+r.cfg.Table+` WHERE published_at IS NULL AND `+cond), args...)
	if err != nil {
		return nil, nil, fmt.Errorf("move %d parked events out of %s: %w", len(ids), r.cfg.Table, err)
	}
	if n, _ := res.RowsAffected(); n != inserted || n != int64(len(ids)) {
		return nil, nil, fmt.Errorf("parking %d outbox events: %d copied, %d removed (rows changed meanwhile); nothing parked", len(ids), inserted, n)
	}
	return moved, kept, nil
}

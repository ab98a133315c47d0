package metrics

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// An outbox row put back by `router outbox retry` keeps its id and its created_at. Its age
// from created_at counts the time it was parked, while nothing could publish it. The relay's
// lag is the time a row has waited since it became publishable: since it was created, or
// since it was put back. The outbox keeps no record of the second, so each router's metrics
// remember the oldest unpublished rows from one database read to the next: a row unpublished
// now that was not at the previous read, though created before it, was put back (or its
// transaction committed) after that read, and counts from that read.

// publishableWindow bounds the oldest unpublished rows read and remembered. The rows past a
// full window count from their created_at.
const publishableWindow = 1000

// publishableQuery reads the oldest unpublished rows in id order, from the outbox's index on
// published_at and id. A row put back keeps its id, so it is among them.
var publishableQuery = fmt.Sprintf(`SELECT id, created_at FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT %d`, publishableWindow)

// publishableBeyond is the oldest created_at of the unpublished rows past a full window.
const publishableBeyond = `SELECT MIN(created_at) FROM outbox WHERE published_at IS NULL AND id > ?`

// outboxRow is an unpublished outbox row as the window reads it.
type outboxRow struct {
	id      int64
	created time.Time
}

// publishable remembers the window of the previous read. Only the refresh in flight uses
// it, and one refresh runs at a time.
type publishable struct {
	at   time.Time           // when the previous window was read; zero before the first read
	seen map[int64]time.Time // its rows: id → when the row became publishable
	full bool                // it held publishableWindow rows, so rows past last were not read
	last int64               // its last id
}

// observe takes the window read at now, unpublished rows in id order, and returns when the
// first of them became publishable (zero when there are none). A row of the previous window
// keeps the time it had. A row read for the first time counts from its created_at when it
// may have been unpublished unseen before: at the first read, or past a full window. Any
// other row was not unpublished at the previous read: it counts from that read, or from its
// created_at when that is later.
func (p *publishable) observe(now time.Time, rows []outboxRow) time.Time {
	seen := make(map[int64]time.Time, len(rows))
	var first time.Time
	for _, r := range rows {
		since, ok := p.seen[r.id]
		switch {
		case ok:
		case p.at.IsZero() || (p.full && r.id > p.last):
			since = r.created
		default:
			since = r.created
			if p.at.After(since) {
				since = p.at
			}
		}
		seen[r.id] = since
		if first.IsZero() || since.Before(first) {
			first = since
		}
	}
	p.at, p.seen, p.full = now, seen, len(rows) >= publishableWindow
	if len(rows) > 0 {
		p.last = rows[len(rows)-1].id
	}
	return first
}

// read reads the window and returns the age of the oldest unpublished row,
// counted from when it became publishable; 0 when none is unpublished.
func (p *publishable) read(ctx context.Context, db *sql.DB) (time.Duration, error) {
	rows, err := db.QueryContext(ctx, publishableQuery)
	if err != nil {
		return 0, err
	}
	var window []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.id, &r.created); err != nil {
			rows.Close()
			return 0, err
		}
		window = append(window, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	var beyond sql.NullTime
	if len(window) >= publishableWindow {
		if err := db.QueryRowContext(ctx, dbx.DialectOf(db).Rebind(publishableBeyond), window[len(window)-1].id).Scan(&beyond); err != nil {
			return 0, err
		}
	}
	now := time.Now()
	first := p.observe(now, window)
	if beyond.Valid && (first.IsZero() || beyond.Time.Before(first)) {
		first = beyond.Time
	}
	if first.IsZero() {
		return 0, nil
	}
	return max(now.Sub(first), 0), nil
}

package inboxops

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/inbox/engine"
)

// ErrNoRow is Store.Get's error for an id no inbox row has.
var ErrNoRow = errors.New("no such inbox row")

// Get returns the inbox row with id in full, with its payload and metadata. It returns
// ErrNoRow when there is none.
func (s *Store) Get(ctx context.Context, id int64) (Row, error) {
	r, err := scanRow(s.db.QueryRowContext(ctx, s.d.Rebind("SELECT "+rowColumns+" FROM "+s.table+" WHERE id = ?"), id))
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("inbox row %d: %w", id, ErrNoRow)
	}
	return r, err
}

// Cursor is a position in the order the inbox is browsed in. That order is newest first by
// receive time, created_at, then by id. created_at never changes once a row is inserted.
// The inbox's index on biz_type, status and created_at holds the id after created_at. So a
// page is one ordered range of that index per biz type and status, however large the
// table. Paging is by key, never by an OFFSET.
type Cursor struct {
	CreatedAt time.Time
	ID        int64
}

// IsZero reports whether c is no position, which stands for the newest rows.
func (c Cursor) IsZero() bool { return c.ID == 0 }

// String encodes c for a URL as "<created_at in Unix nanoseconds>-<id>".
func (c Cursor) String() string {
	if c.IsZero() {
		return ""
	}
	return strconv.FormatInt(c.CreatedAt.UnixNano(), 10) + "-" + strconv.FormatInt(c.ID, 10)
}

// ParseCursor decodes Cursor.String. It decodes "" as the zero cursor.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	ns, id, ok := strings.Cut(s, "-")
	n, err1 := strconv.ParseInt(ns, 10, 64)
	i, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil || i <= 0 {
		return Cursor{}, fmt.Errorf("cursor %q: want <unix nanoseconds>-<id>", s)
	}
	return Cursor{CreatedAt: time.Unix(0, n).UTC(), ID: i}, nil
}

func cursorOf(r Row) Cursor { return Cursor{CreatedAt: r.CreatedAt, ID: r.ID} }

// PageQuery selects one page of inbox rows for browsing, newest first.
type PageQuery struct {
	// BizTypes are the biz types to read, at least one. A page reads one index range per
	// biz type and status.
	BizTypes []string
	// Statuses are the statuses to read. Empty means all three.
	Statuses []engine.Status
	// Reason selects only failed rows with this reason. Only failed rows have one.
	Reason string
	// Keys selects only the rows of these dedup keys. The unique key allows one row per key
	// and biz type.
	Keys []string
	// PoisonKeys with Keys also selects the poison rows whose record had one of Keys as its
	// Kafka key or its payload's id, as Filter.PoisonKeys does. They are read over each biz
	// type's failed rows.
	PoisonKeys bool
	// Since and Until bound created_at, from Since inclusive to Until exclusive.
	Since, Until time.Time
	// Before selects the rows older than this position, for the next page. After selects
	// the rows newer than it, for the previous page. At most one may be set. With neither,
	// the page holds the newest rows.
	Before, After Cursor
	// Limit is the page size, 1..500.
	Limit int
}

// Page is one page of rows, newest first. Rows carry no payload and no metadata. Get reads
// a row in full.
type Page struct {
	Rows []Row
	// Older is the cursor of the next page, for PageQuery.Before. Newer is the cursor of
	// the previous one, for PageQuery.After. Each is zero when there is no such page.
	Older, Newer Cursor
}

// maxPage bounds PageQuery.Limit.
const maxPage = 500

// browseColumns are rowColumns of the table aliased i, without the payload and the
// metadata. So a page of rows reads no value, however large the stored ones are. The
// metadata reads as JSON null, meaning no headers, not as SQL NULL, which marks a minimal
// row.
var browseColumns = func() string {
	c := strings.Replace(rowColumns, "payload, metadata,", "'' AS payload, 'null' AS metadata,", 1)
	if c == rowColumns {
		panic("inbox: rowColumns no longer lists payload, metadata: update browseColumns")
	}
	parts := strings.Split(c, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, " AS ") {
			p = "i." + p
		}
		parts[i] = p
	}
	return strings.Join(parts, ", ")
}()

// Page returns one page of the rows q selects. Each pair of biz type and status is one
// ordered, limited range of the index on biz_type, status and created_at. The index holds
// the id after created_at, so the range reads only index entries. The parts are joined
// with UNION ALL and merged by the server. The page's rows are then read by primary key. A
// page costs the same on a million rows as on a hundred, and counts nothing.
//
// The ranges select only ids. Selecting the rows' other columns in the ranges themselves
// would let the optimizer prefer a scan of the whole prefix of biz type and status,
// filtered by the time bounds. That scan reads far more index entries than a page needs.
// Selecting the ids first keeps every range covered by the index. Keys read the unique key
// on dedup_key and biz_type instead. A reason, which is not in the index, filters the
// failed rows' range.
func (s *Store) Page(ctx context.Context, q PageQuery) (Page, error) {
	query, args, err := s.pageSQL(q)
	if err != nil || query == "" {
		return Page{}, err
	}
	newer := !q.After.IsZero()
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return Page{}, fmt.Errorf("inbox page: %w", err)
	}
	defer rows.Close()
	var p Page
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return Page{}, err
		}
		p.Rows = append(p.Rows, r)
	}
	if err := rows.Err(); err != nil {
		return Page{}, fmt.Errorf("inbox page: %w", err)
	}
	more := len(p.Rows) > q.Limit
	if more {
		p.Rows = p.Rows[:q.Limit]
	}
	if newer {
		slices.Reverse(p.Rows)
	}
	if len(p.Rows) == 0 {
		return p, nil
	}
	first, last := cursorOf(p.Rows[0]), cursorOf(p.Rows[len(p.Rows)-1])
	switch {
	case newer:
		p.Older = last
		if more {
			p.Newer = first
		}
	default:
		if more {
			p.Older = last
		}
		if !q.Before.IsZero() {
			p.Newer = first
		}
	}
	return p, nil
}

// pageSQL is Page's statement. It is "" when q can select nothing.
func (s *Store) pageSQL(q PageQuery) (string, []any, error) {
	if err := q.validate(); err != nil {
		return "", nil, err
	}
	statuses := q.Statuses
	if len(statuses) == 0 {
		statuses = []engine.Status{engine.StatusProcessing, engine.StatusDone, engine.StatusFailed}
	}
	if q.Reason != "" {
		if !slices.Contains(statuses, engine.StatusFailed) {
			return "", nil, nil
		}
		statuses = []engine.Status{engine.StatusFailed}
	}
	newer := !q.After.IsZero()
	dir, cur, cmp := "DESC", q.Before, "<"
	if newer {
		dir, cur, cmp = "ASC", q.After, ">"
	}
	var parts []string
	var args []any
	part := func(where []string, a []any) {
		if q.Reason != "" {
			where = append(where, "reason = ?")
			a = append(a, q.Reason)
		}
		if !q.Since.IsZero() {
			where = append(where, "created_at >= ?")
			a = append(a, q.Since.UTC())
		}
		if !q.Until.IsZero() {
			where = append(where, "created_at < ?")
			a = append(a, q.Until.UTC())
		}
		if !cur.IsZero() {
			where = append(where, "(created_at "+cmp+" ? OR (created_at = ? AND id "+cmp+" ?))")
			a = append(a, cur.CreatedAt.UTC(), cur.CreatedAt.UTC(), cur.ID)
		}
		parts = append(parts, "(SELECT id, created_at FROM "+s.table+" WHERE "+strings.Join(where, " AND ")+
			" ORDER BY created_at "+dir+", id "+dir+" LIMIT "+strconv.Itoa(q.Limit+1)+")")
		args = append(args, a...)
	}
	if len(q.Keys) > 0 {
		a := utf8Keys(q.Keys)
		where := []string{"1 = 0"}
		if len(a) > 0 {
			where = []string{"dedup_key IN " + placeholders(len(a))}
		}
		where = append(where, "biz_type IN "+placeholders(len(q.BizTypes)), "status IN "+placeholders(len(statuses)))
		for _, b := range q.BizTypes {
			a = append(a, b)
		}
		for _, st := range statuses {
			a = append(a, string(st))
		}
		part(where, a)
		if q.PoisonKeys && slices.Contains(statuses, engine.StatusFailed) {
			cond, na := notedWhere(q.Keys)
			for _, b := range q.BizTypes {
				part([]string{"biz_type = ?", "status = ?", "reason IN (?, ?)", cond},
					append([]any{b, string(engine.StatusFailed), string(engine.ReasonPoison), string(engine.ReasonPanic)}, na...))
			}
		}
	} else {
		for _, b := range q.BizTypes {
			for _, st := range statuses {
				part([]string{"biz_type = ?", "status = ?"}, []any{b, string(st)})
			}
		}
	}
	ids := parts[0]
	if len(parts) > 1 {
		ids = "(" + strings.Join(parts, " UNION ALL ") + " ORDER BY created_at " + dir + ", id " + dir + " LIMIT " + strconv.Itoa(q.Limit+1) + ")"
	}
	query := "SELECT " + browseColumns + " FROM " + s.table + " i JOIN " + ids + " p ON i.id = p.id ORDER BY p.created_at " + dir + ", p.id " + dir
	return s.d.Rebind(query), args, nil
}

func (q PageQuery) validate() error {
	switch {
	case len(q.BizTypes) == 0:
		return errors.New("inbox page: no biz type")
	case q.Limit < 1 || q.Limit > maxPage:
		return fmt.Errorf("inbox page: limit %d outside 1..%d", q.Limit, maxPage)
	case !q.Before.IsZero() && !q.After.IsZero():
		return errors.New("inbox page: before and after both set")
	case len(q.Keys) > 16:
		return fmt.Errorf("inbox page: %d keys, at most 16", len(q.Keys))
	case len(q.Reason) > 32:
		return fmt.Errorf("inbox page: reason longer than 32 bytes")
	case !q.Since.IsZero() && !q.Until.IsZero() && !q.Since.Before(q.Until):
		return fmt.Errorf("inbox page: since %s is not before until %s", q.Since.Format(time.RFC3339), q.Until.Format(time.RFC3339))
	}
	for _, k := range q.Keys {
		if k == "" || len(k) > 191 {
			return fmt.Errorf("inbox page: key %q must be 1..191 bytes", k)
		}
	}
	for _, b := range q.BizTypes {
		if b == "" || len(b) > 64 {
			return fmt.Errorf("inbox page: biz type %q must be 1..64 bytes", b)
		}
	}
	for _, st := range q.Statuses {
		if _, err := ParseStatus(string(st)); err != nil {
			return fmt.Errorf("inbox page: %w", err)
		}
	}
	return nil
}

// placeholders returns "(?, ?, ..., ?)" with n marks, for n above 0.
func placeholders(n int) string {
	return "(?" + strings.Repeat(", ?", n-1) + ")"
}

package inboxops

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// Filter selects inbox rows for inspection and replay. Zero fields match everything.
type Filter struct {
	BizType string `json:"biz_type,omitempty"`
	// Statuses selects rows of any of these statuses. Empty means every status.
	Statuses []engine.Status `json:"statuses,omitempty"`
	// OlderThan selects rows last updated more than this long ago. For 'processing' rows
	// that means stuck rows.
	OlderThan time.Duration `json:"older_than,omitempty"`
	// Reasons selects failed rows with any of these reasons.
	Reasons []engine.Reason `json:"reasons,omitempty"`
	// Keys selects rows with any of these dedup keys, such as order ids.
	Keys []string `json:"keys,omitempty"`
	// Refs selects rows by any of these row ids or dedup keys, as in `router inbox show 42`
	// and `show ord-1`.
	Refs []string `json:"refs,omitempty"`
	// Since and Until bound created_at, when the key was first received. Since is
	// inclusive and Until exclusive.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// ReplayID selects rows stamped by this replay.
	ReplayID int64 `json:"replay_id,omitempty"`
	// Limit caps the number of rows. 0 means no limit.
	Limit int `json:"limit,omitempty"`
	// PoisonKeys selects, beside the rows of Keys, the poison rows whose record had one of
	// Keys as its Kafka key or as its payload's id. A poison row's dedup key names the
	// record's place in Kafka, and its last error notes the key and the id. They are read
	// over the failed rows of BizType, or of each of PoisonBizTypes when BizType is empty.
	// List, Count and CountUpTo read them. A replay does not.
	PoisonKeys     bool     `json:"-"`
	PoisonBizTypes []string `json:"-"`

	noted []string // keys the last error's notes hold, in a filter of poisonParts
}

// ParseStatus accepts processing, done and failed.
func ParseStatus(s string) (engine.Status, error) {
	switch st := engine.Status(strings.ToLower(strings.TrimSpace(s))); st {
	case engine.StatusProcessing, engine.StatusDone, engine.StatusFailed:
		return st, nil
	}
	return "", fmt.Errorf("unknown status %q (use failed, processing or done)", s)
}

// Reasons are the reasons a failed row can have.
var Reasons = []engine.Reason{engine.ReasonPoison, engine.ReasonConflict, engine.ReasonRetriesExhausted,
	engine.ReasonPermanent, engine.ReasonData, engine.ReasonPanic, engine.ReasonTimeout, engine.ReasonDelayed}

// reasonsText lists the reasons ParseReason accepts.
const reasonsText = "use poison, conflict, retries_exhausted, permanent, data, panic, timeout, delayed, or resolved for the rows an operator resolved"

// ParseReason accepts the reasons of Reasons, and engine.ReasonResolved. That is the reason
// of a done row an operator resolved with Store.Resolve.
func ParseReason(s string) (engine.Reason, error) {
	r := engine.Reason(strings.ToLower(strings.TrimSpace(s)))
	if slices.Contains(Reasons, r) || r == engine.ReasonResolved {
		return r, nil
	}
	return "", fmt.Errorf("unknown reason %q (%s)", s, reasonsText)
}

// Validate reports the first invalid field.
func (f Filter) Validate() error {
	for _, s := range f.Statuses {
		if _, err := ParseStatus(string(s)); err != nil {
			return err
		}
	}
	for _, r := range f.Reasons {
		if p, err := ParseReason(string(r)); err != nil || p != r {
			return fmt.Errorf("unknown reason %q (%s)", r, reasonsText)
		}
	}
	switch {
	case f.OlderThan < 0:
		return fmt.Errorf("older-than %s is negative", f.OlderThan)
	case f.Limit < 0:
		return fmt.Errorf("limit %d is negative", f.Limit)
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until):
		return fmt.Errorf("since %s is not before until %s", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	case len(f.BizType) > 64:
		return fmt.Errorf("biz type %q longer than 64 bytes", f.BizType)
	}
	for _, k := range append(append([]string(nil), f.Keys...), f.Refs...) {
		if k == "" || len(k) > 191 {
			return fmt.Errorf("order id / key %q must be 1..191 bytes", k)
		}
	}
	return nil
}

// Row is one inbox row as stored.
type Row struct {
	ID          int64         `json:"id"`
	DedupKey    string        `json:"dedup_key"`
	BizType     string        `json:"biz_type"`
	Status      engine.Status `json:"status"`
	Reason      string        `json:"reason,omitempty"`
	MessageUUID string        `json:"message_uuid"`
	Topic       string        `json:"topic"`
	Partition   int32         `json:"partition"`
	Offset      int64         `json:"offset"`
	Payload     []byte        `json:"-"`
	// Tombstone reports that the record had no value, and Payload is empty.
	Tombstone bool `json:"tombstone,omitempty"`
	// PayloadSize is the value's size when Payload holds less than it. Payload then holds
	// a prefix of a value over inbox.max_payload_bytes, or nothing in a minimal quarantine
	// row. PayloadSize is 0 otherwise.
	PayloadSize int64             `json:"payload_size,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Fingerprint string            `json:"fingerprint"`
	Attempts    int               `json:"attempts"`
	Duplicates  int               `json:"duplicates"`
	LastError   string            `json:"last_error,omitempty"`
	ReplayID    int64             `json:"replay_id,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	ExpireAt    time.Time         `json:"expire_at"`
	// RetryAt is when a row waiting for a delayed redelivery runs again. See Delayed.
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// DelayedRounds counts the delayed redeliveries the row had.
	DelayedRounds int `json:"delayed_rounds,omitempty"`

	sized bool // payload_size is set: a prefix of the value, or a minimal row
	bare  bool // metadata is SQL NULL: a minimal row (a Page's rows read JSON null instead)
}

// Delayed reports whether r waits for a delayed redelivery, with status failed and reason
// delayed. Such a row is not quarantined, and its next attempt is at RetryAt.
func (r Row) Delayed() bool {
	return r.Status == engine.StatusFailed && r.Reason == string(engine.ReasonDelayed)
}

// StatusText is r's status as the operator reads it. A row waiting for a delayed
// redelivery is "delayed (next attempt at …)", not failed.
func (r Row) StatusText() string {
	if !r.Delayed() {
		return string(r.Status)
	}
	if r.RetryAt == nil {
		return "delayed"
	}
	return "delayed (next attempt at " + r.RetryAt.Format(time.RFC3339) + ")"
}

// ErrNotReplayable is what Row.Replayable wraps.
var ErrNotReplayable = errors.New("not replayable")

// Replayable returns nil when r holds its message as it was delivered. Otherwise it
// returns an error wrapping ErrNotReplayable that says what was cut. A value over
// inbox.max_payload_bytes is stored as a prefix. Headers over inbox.max_metadata_bytes are
// stored capped. A minimal row stores neither. Running what is left would run a message
// nobody sent. So a replay refuses such a row and leaves it quarantined for inspection. r
// must be read in full, by Store.Get or List, because a Page's rows carry no metadata.
func (r Row) Replayable() error {
	_, capped := r.Metadata[engine.MetadataTruncatedKey]
	switch {
	case r.sized && r.bare:
		return fmt.Errorf("%w: stored without its value and headers (the database refused the full row)", ErrNotReplayable)
	case r.PayloadSize > 0:
		return fmt.Errorf("%w: only a %d-byte prefix of its %d-byte value is stored (over inbox.max_payload_bytes)", ErrNotReplayable, len(r.Payload), r.PayloadSize)
	case r.sized:
		return fmt.Errorf("%w: stored without its headers (the database refused the full row)", ErrNotReplayable)
	case capped:
		return fmt.Errorf("%w: its headers are stored cut to inbox.max_metadata_bytes (%s)", ErrNotReplayable, validText(r.Metadata[engine.MetadataTruncatedKey], 200))
	}
	return nil
}

// Poison reports whether the row holds a message that could not be decoded. Replaying it
// quarantines it again.
func (r Row) Poison() bool { return r.Reason == string(engine.ReasonPoison) }

// Truncated reports whether the row holds less than the message's value. Such a row
// cannot be replayed.
func (r Row) Truncated() bool { return r.PayloadSize > 0 }

// Message rebuilds the stored message, with its uuid, payload and metadata, for a replay.
// A tombstone's payload is nil, as it was delivered. The message of a poison row carries
// the Kafka key its last error notes. So a replay that quarantines it again notes the key
// again.
func (r Row) Message() *message.Message {
	var payload []byte
	if !r.Tombstone {
		payload = append([]byte{}, r.Payload...)
	}
	m := message.NewMessage(r.MessageUUID, payload)
	for k, v := range r.Metadata {
		m.Metadata.Set(k, v)
	}
	if r.poisonReason() {
		if key, ok := msgsource.NotedKey(r.LastError); ok {
			m.SetContext(msgsource.WithKey(context.Background(), key))
		}
	}
	return m
}

// poisonReason reports whether r failed because its message could not be decoded. Such a
// row's last error begins with the notes of its Kafka key and payload id.
func (r Row) poisonReason() bool {
	return r.Reason == string(engine.ReasonPoison) || r.Reason == string(engine.ReasonPanic)
}

// Source is where the stored message came from.
func (r Row) Source() inbox.Source {
	return inbox.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
}

// Store reads inbox rows. The one change it makes is Resolve. Every other change goes
// through engine.Inbox.Process.
type Store struct {
	db    *sql.DB
	d     dbx.Dialect // the pool's: every statement goes through d.Rebind
	table string
}

// NewStore returns a Store on table, "inbox" by default.
func NewStore(db *sql.DB, table string) (*Store, error) {
	if db == nil {
		return nil, errors.New("inbox store: db is required")
	}
	if table == "" {
		table = "inbox"
	}
	if err := dbx.CheckIdent("inbox table", table); err != nil {
		return nil, fmt.Errorf("inbox store: %w", err)
	}
	return &Store{db: db, d: dbx.DialectOf(db), table: table}, nil
}

const rowColumns = `id, dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset,
 payload, metadata, fingerprint, attempts, duplicates, last_error, replay_id, created_at, updated_at, expire_at, tombstone, payload_size,
 retry_at, delayed_rounds`

// List returns the rows f selects, ordered by id.
func (s *Store) List(ctx context.Context, f Filter) ([]Row, error) {
	rows, err := s.list(ctx, f, 0, 0)
	parts := f.poisonParts()
	if err != nil || len(parts) == 0 {
		return rows, err
	}
	seen := map[int64]bool{}
	for _, r := range rows {
		seen[r.ID] = true
	}
	for _, p := range parts {
		more, err := s.list(ctx, p, 0, 0)
		if err != nil {
			return nil, err
		}
		for _, r := range more {
			if !seen[r.ID] {
				seen[r.ID] = true
				rows = append(rows, r)
			}
		}
	}
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.ID, b.ID) })
	if f.Limit > 0 && len(rows) > f.Limit {
		rows = rows[:f.Limit]
	}
	return rows, nil
}

// poisonParts returns the filters of the poison rows that f.PoisonKeys selects beside the
// rows of f.Keys, one per biz type. Each reads the failed rows of reason poison or panic
// whose last error notes one of the keys. poisonParts returns none when f's statuses or
// reasons leave such rows out.
func (f Filter) poisonParts() []Filter {
	if !f.PoisonKeys || len(f.Keys) == 0 || (len(f.Statuses) > 0 && !slices.Contains(f.Statuses, engine.StatusFailed)) {
		return nil
	}
	var reasons []engine.Reason
	for _, r := range []engine.Reason{engine.ReasonPoison, engine.ReasonPanic} {
		if len(f.Reasons) == 0 || slices.Contains(f.Reasons, r) {
			reasons = append(reasons, r)
		}
	}
	bizTypes := f.PoisonBizTypes
	if f.BizType != "" {
		bizTypes = []string{f.BizType}
	}
	if len(reasons) == 0 {
		return nil
	}
	var out []Filter
	for _, b := range bizTypes {
		p := f
		p.BizType, p.Statuses, p.Reasons, p.Keys, p.Refs = b, []engine.Status{engine.StatusFailed}, reasons, nil, nil
		p.PoisonKeys, p.PoisonBizTypes, p.noted = false, nil, f.Keys
		out = append(out, p)
	}
	return out
}

// utf8Keys returns the keys that are valid UTF-8. A dedup key always is, and PostgreSQL
// refuses a parameter that is not. A key that is not UTF-8 can still be a poison record's
// Kafka key, which notedWhere reads escaped.
func utf8Keys(keys []string) []any {
	var out []any
	for _, k := range keys {
		if utf8.ValidString(k) {
			out = append(out, k)
		}
	}
	return out
}

// notedWhere is the condition that the last error notes one of keys, as a Kafka key or a
// payload's id, and its arguments. See msgsource.Notes.
func notedWhere(keys []string) (string, []any) {
	var conds []string
	var args []any
	for _, k := range keys {
		conds = append(conds, "last_error LIKE ? ESCAPE '!'", "last_error LIKE ? ESCAPE '!'")
		args = append(args, "%"+likeText(msgsource.KeyNote(k)+"; ")+"%", "%"+likeText(msgsource.IDNote(k)+"; ")+"%")
	}
	return "(" + strings.Join(conds, " OR ") + ")", args
}

// likeText is s as a LIKE pattern that matches s alone, with '!' as the escape character.
// The backslashes of a note's escapes are then plain characters on every server.
var likeText = strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace

// list adds bounds on the id, above afterID and at most maxID. Replay uses them to page
// through a selection that it changes as it goes.
func (s *Store) list(ctx context.Context, f Filter, afterID, maxID int64) ([]Row, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	where, args := f.where(time.Now())
	if afterID > 0 {
		where = append(where, "id > ?")
		args = append(args, afterID)
	}
	if maxID > 0 {
		where = append(where, "id <= ?")
		args = append(args, maxID)
	}
	q := "SELECT " + rowColumns + " FROM " + s.table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id"
	if f.Limit > 0 {
		q += " LIMIT " + strconv.Itoa(f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, s.d.Rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("list inbox: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list inbox: %w", err)
	}
	return out, nil
}

// MaxID returns the highest row id, or 0 for an empty table.
func (s *Store) MaxID(ctx context.Context) (int64, error) {
	var id sql.NullInt64
	if err := s.db.QueryRowContext(ctx, "SELECT MAX(id) FROM "+s.table).Scan(&id); err != nil {
		return 0, fmt.Errorf("inbox max id: %w", err)
	}
	return id.Int64, nil
}

// Count returns the number of rows f selects, ignoring f.Limit.
func (s *Store) Count(ctx context.Context, f Filter) (int, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	where, args := f.where(time.Now())
	q := "SELECT COUNT(*) FROM " + s.table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	var n int
	if err := s.db.QueryRowContext(ctx, s.d.Rebind(q), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count inbox: %w", err)
	}
	for _, p := range f.poisonParts() {
		k, err := s.Count(ctx, p)
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}

// CountUpTo counts the rows f selects, at most f.Limit of them, or all when f.Limit is 0.
// The count reads no more index entries than that.
func (s *Store) CountUpTo(ctx context.Context, f Filter) (int, error) {
	if f.Limit == 0 {
		return s.Count(ctx, f)
	}
	if err := f.Validate(); err != nil {
		return 0, err
	}
	where, args := f.where(time.Now())
	q := "SELECT 1 FROM " + s.table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q = "SELECT COUNT(*) FROM (" + q + " LIMIT " + strconv.Itoa(f.Limit) + ") capped"
	var n int
	if err := s.db.QueryRowContext(ctx, s.d.Rebind(q), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count inbox: %w", err)
	}
	for _, p := range f.poisonParts() {
		if n >= f.Limit {
			break
		}
		k, err := s.CountUpTo(ctx, p)
		if err != nil {
			return 0, err
		}
		n += k
	}
	return min(n, f.Limit), nil
}

func (f Filter) where(now time.Time) ([]string, []any) {
	var where []string
	var args []any
	in := func(col string, vals []any) {
		where = append(where, col+" IN ("+strings.TrimSuffix(strings.Repeat("?,", len(vals)), ",")+")")
		args = append(args, vals...)
	}
	if f.BizType != "" {
		where = append(where, "biz_type = ?")
		args = append(args, f.BizType)
	}
	statuses := f.Statuses
	if len(statuses) == 0 && (!f.Since.IsZero() || !f.Until.IsZero()) {
		// Every status is named. The index on biz_type, status and created_at, from
		// migration 00008, then serves the time range as one range per status instead of a
		// scan.
		statuses = []engine.Status{engine.StatusProcessing, engine.StatusDone, engine.StatusFailed}
	}
	if len(statuses) > 0 {
		vals := make([]any, len(statuses))
		for i, s := range statuses {
			vals[i] = string(s)
		}
		in("status", vals)
	}
	if len(f.Reasons) > 0 {
		vals := make([]any, len(f.Reasons))
		for i, r := range f.Reasons {
			vals[i] = string(r)
		}
		in("reason", vals)
	}
	if f.OlderThan > 0 {
		where = append(where, "updated_at < ?")
		args = append(args, now.Add(-f.OlderThan).UTC())
	}
	if len(f.Keys) > 0 {
		if vals := utf8Keys(f.Keys); len(vals) > 0 {
			in("dedup_key", vals)
		} else {
			where = append(where, "1 = 0")
		}
	}
	if len(f.Refs) > 0 {
		var ids, keys []any
		for _, r := range f.Refs {
			keys = append(keys, r)
			if id, err := strconv.ParseInt(r, 10, 64); err == nil && id > 0 {
				ids = append(ids, id)
			}
		}
		cond := "dedup_key IN (" + strings.TrimSuffix(strings.Repeat("?,", len(keys)), ",") + ")"
		args = append(args, keys...)
		if len(ids) > 0 {
			cond = "(" + cond + " OR id IN (" + strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + "))"
			args = append(args, ids...)
		}
		where = append(where, cond)
	}
	if !f.Since.IsZero() {
		where = append(where, "created_at >= ?")
		args = append(args, f.Since.UTC())
	}
	if !f.Until.IsZero() {
		where = append(where, "created_at < ?")
		args = append(args, f.Until.UTC())
	}
	if len(f.noted) > 0 {
		cond, a := notedWhere(f.noted)
		where = append(where, cond)
		args = append(args, a...)
	}
	if f.ReplayID > 0 {
		// replay_row lists the rows the replay stamped. A later replay may have stamped
		// some again.
		where = append(where, "id IN (SELECT inbox_id FROM "+ReplayRowTable+" WHERE replay_id = ?) AND replay_id = ?")
		args = append(args, f.ReplayID, f.ReplayID)
	}
	return where, args
}

type scanner interface{ Scan(dest ...any) error }

func scanRow(sc scanner) (Row, error) {
	var r Row
	var reason, meta, lastErr sql.NullString
	var replay, size sql.NullInt64
	var retryAt sql.NullTime
	err := sc.Scan(&r.ID, &r.DedupKey, &r.BizType, &r.Status, &reason, &r.MessageUUID, &r.Topic, &r.Partition, &r.Offset,
		&r.Payload, &meta, &r.Fingerprint, &r.Attempts, &r.Duplicates, &lastErr, &replay, &r.CreatedAt, &r.UpdatedAt, &r.ExpireAt,
		&r.Tombstone, &size, &retryAt, &r.DelayedRounds)
	if err != nil {
		return r, fmt.Errorf("scan inbox row: %w", err)
	}
	if retryAt.Valid && r.Delayed() {
		at := retryAt.Time.UTC()
		r.RetryAt = &at
	}
	r.Fingerprint = strings.TrimRight(r.Fingerprint, " ") // PostgreSQL pads CHAR(64); MariaDB strips it
	r.Reason, r.LastError, r.ReplayID, r.PayloadSize = reason.String, lastErr.String, replay.Int64, size.Int64
	r.sized, r.bare = size.Valid, !meta.Valid
	if meta.Valid && meta.String != "" && meta.String != "null" {
		if err := json.Unmarshal([]byte(meta.String), &r.Metadata); err != nil {
			return r, fmt.Errorf("inbox row %d: metadata: %w", r.ID, err)
		}
	}
	return r, nil
}

// validText returns s as valid UTF-8 of at most max bytes, cut on a character boundary.
// Each invalid byte sequence is replaced by U+FFFD.
func validText(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

package inboxops

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// ReplayResolved is the outcome the replay table records for a resolution by
// Store.Resolve. The resolution selects one row and runs none, and its error column holds
// the operator's reason.
const ReplayResolved = "resolved"

// MaxResolveReason bounds the reason an operator gives for a resolution, in bytes.
const MaxResolveReason = 500

// ErrNotQuarantined is Store.Resolve's error for a row that is not quarantined. Such a row
// is done, processing, or waiting for a delayed redelivery.
var ErrNotQuarantined = errors.New("not quarantined")

// ErrBadReason is Store.Resolve's error for a reason that CheckResolveReason refuses.
var ErrBadReason = errors.New("bad reason")

// Resolution is what Store.Resolve did.
type Resolution struct {
	Row      Row   // the row as it was before: failed, with its reason and last error
	ReplayID int64 // the resolution's record in the replay table
	Reason   string
}

// CheckResolveReason returns the reason an operator gives for a resolution as it is
// stored, trimmed of surrounding spaces. The reason must say something, in at most
// MaxResolveReason bytes of UTF-8 without control characters. Otherwise CheckResolveReason
// returns an error wrapping ErrBadReason.
func CheckResolveReason(reason string) (string, error) {
	r := strings.TrimSpace(reason)
	switch {
	case r == "":
		return "", fmt.Errorf(`%w: empty: say why the row needs nothing more (--reason "corrected record processed as o-17")`, ErrBadReason)
	case len(r) > MaxResolveReason:
		return "", fmt.Errorf("%w: %d bytes, more than %d", ErrBadReason, len(r), MaxResolveReason)
	case !utf8.ValidString(r):
		return "", fmt.Errorf("%w: not UTF-8", ErrBadReason)
	case strings.IndexFunc(r, unicode.IsControl) >= 0:
		return "", fmt.Errorf("%w: holds a control character (a line break, a tab)", ErrBadReason)
	}
	return r, nil
}

// Resolve marks the quarantined row id resolved. The operator says that its key needs
// nothing more, because its cause was dealt with otherwise. For example, the corrected
// record was processed under its own key.
//
// In one transaction the row becomes 'done' with reason engine.ReasonResolved. Its last
// error becomes the reason given, followed by what it was quarantined for. The resolution
// is recorded in the replay table, with outcome ReplayResolved and the reason in its error
// column. The row is stamped as a replay stamps it.
//
// The row then no longer counts as failed. A later delivery of its key with the same
// fingerprint is a duplicate, counted and never run, as for any done row. What the handler
// committed for the key stays as it is. A row that is not quarantined is refused with
// ErrNotQuarantined, and one that does not exist with ErrNoRow.
func (s *Store) Resolve(ctx context.Context, id int64, reason string) (Resolution, error) {
	res := Resolution{}
	r, err := CheckResolveReason(reason)
	if err != nil {
		return res, err
	}
	res.Reason = r
	err = dbx.InTx(ctx, s.db, func(tx *sql.Tx) error {
		row, err := scanRow(tx.QueryRowContext(ctx, s.d.Rebind("SELECT "+rowColumns+" FROM "+s.table+" WHERE id = ? FOR UPDATE"), id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("inbox row %d: %w", id, ErrNoRow)
		}
		if err != nil {
			return err
		}
		res.Row = row
		if row.Status != engine.StatusFailed || row.Delayed() {
			return fmt.Errorf("inbox row %d is %s: %w (only a failed row is resolved)", id, row.StatusText(), ErrNotQuarantined)
		}
		now := time.Now().UTC()
		filter, _ := json.Marshal(Filter{BizType: row.BizType, Statuses: []engine.Status{engine.StatusFailed}, Refs: []string{strconv.FormatInt(id, 10)}})
		if res.ReplayID, err = insertReturningID(ctx, tx, s.d, "INSERT INTO "+ReplayTable+` (biz_type, filter, dry_run, started_at, finished_at, selected, outcome, error)
 VALUES (?, ?, ?, ?, ?, 1, ?, ?)`, row.BizType, string(filter), false, now, now, ReplayResolved, r); err != nil {
			return fmt.Errorf("record the resolution: %w (run `router migrate`)", err)
		}
		if _, err := tx.ExecContext(ctx, s.d.Rebind("INSERT INTO "+ReplayRowTable+" (replay_id, inbox_id) VALUES (?, ?)"), res.ReplayID, id); err != nil {
			return fmt.Errorf("record the resolution: %w", err)
		}
		note := fmt.Sprintf("resolved (replay %d): %s; quarantined as %s", res.ReplayID, r, dash(row.Reason))
		if row.LastError != "" {
			note += ": " + row.LastError
		}
		_, err = tx.ExecContext(ctx, s.d.Rebind("UPDATE "+s.table+` SET status = 'done', reason = ?, retry_at = NULL, replay_id = ?, last_error = ?
 WHERE id = ? AND status = 'failed'`), string(engine.ReasonResolved), res.ReplayID, note, id)
		if err != nil {
			return fmt.Errorf("resolve inbox row %d: %w", id, err)
		}
		return nil
	})
	return res, err
}

// insertReturningID runs the INSERT q in tx and returns the id it made.
func insertReturningID(ctx context.Context, tx *sql.Tx, d dbx.Dialect, q string, args ...any) (int64, error) {
	var id int64
	if d.IsPostgres() {
		err := tx.QueryRowContext(ctx, d.Rebind(q+" RETURNING id"), args...).Scan(&id)
		return id, err
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

package inbox

import (
	"errors"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// ReasonData marks a row quarantined because the database refused the values the
// delivery's statements carry: an invalid byte sequence, a string too long, a number out of
// range, a NULL in a NOT NULL column, a violated unique key, foreign key or CHECK
// (dbx.IsDataError). The same message fails the same way on every attempt, so it is
// quarantined at its first failure, never retried, delayed or counted by the circuit
// breaker; its last error holds the database's message. A replay runs it again once the
// schema or the handler takes such values.
const ReasonData Reason = "data"

// inboxKey is the name of the inbox table's unique key (dedup_key, biz_type), the same on
// every dialect's migrations.
const inboxKey = "uk_dedup"

// isDataError reports an error the database raised for the values of a delivery's
// statements (dbx.IsDataError), except a violation of the inbox's own key: that one is a
// race between two paths of one key, which a retry settles.
func isDataError(err error) bool {
	return dbx.IsDataError(err) && dbx.DuplicateKey(err) != inboxKey
}

// isPermanent reports an error that says no retry can fix it: ErrPermanent (Permanent), or
// an error whose method Permanent() bool says so, as outbox.ErrInvalidEvent's do.
func isPermanent(err error) bool {
	if errors.Is(err, ErrPermanent) {
		return true
	}
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

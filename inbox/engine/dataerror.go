package engine

import (
	"errors"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// ReasonData marks a row quarantined because the database refused the values the
// delivery's statements carry. dbx.IsDataError reports such refusals. They include an
// invalid byte sequence, a string too long, a number out of range and a NULL in a NOT NULL
// column. They also include a violated unique key, foreign key or CHECK. The same message
// fails the same way on every attempt. So it is quarantined at its first failure, and
// never retried, delayed or counted by the circuit breaker. Its last error holds the
// database's message. A replay runs it again once the schema or the handler takes such
// values.
const ReasonData Reason = "data"

// inboxKey is the name of the inbox table's unique key on dedup_key and biz_type. Every
// dialect's migrations give it this name.
const inboxKey = "uk_dedup"

// isDataError reports an error the database raised for the values of a delivery's
// statements, as dbx.IsDataError does. It leaves out a violation of the inbox's own key.
// That one is a race between two paths of one key, which a retry settles.
func isDataError(err error) bool {
	return dbx.IsDataError(err) && dbx.DuplicateKey(err) != inboxKey
}

// isPermanent reports an error that says no retry can fix it. Such an error is
// inbox.ErrPermanent, as Permanent makes it. Or it has a method Permanent that returns true, as
// the errors wrapping outbox.ErrInvalidEvent do.
func isPermanent(err error) bool {
	if errors.Is(err, inbox.ErrPermanent) {
		return true
	}
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

package inbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// ReasonResolved is the reason of a row an operator resolved (`router inbox resolve`): a
// quarantined row whose key needs nothing more, its cause dealt with otherwise (a corrected
// record processed under its own key, say). The row is 'done': it no longer counts as failed,
// and a later delivery of its key is a duplicate. It has no effect of its own, so a plugin's
// Verify leaves it out when it checks that every done row has its effect.
const ReasonResolved Reason = "resolved"

// VerifyEnv is what a plugin's Verify receives from `router verify`.
type VerifyEnv struct {
	DB *sql.DB // the application pool
	// Settings are the plugin's decoded settings, as PluginEnv.Settings.
	Settings any
	// Keys are the business keys of the producer ledgers given (`verify --ledger`, written by
	// `router produce --ledger`): each should have ended processed or quarantined. Empty
	// without a ledger.
	Keys []string
	// LagBound is relay.lag_bound: outbox rows unpublished for longer are a violation.
	LagBound time.Duration
	// ReadTopic reads every committed record of a topic (read_committed), to count the
	// events that reached Kafka; nil unless `verify --kafka` was given.
	ReadTopic func(ctx context.Context, topic string) ([]kafkax.Record, error)
}

// Verification is what a plugin's Verify found. `router verify` prints the summary and the
// notes, one VIOLATION line per violation, and exits 1 when there is one.
type Verification struct {
	Summary    string   // one line of counts, key=value pairs
	Violations []string // broken invariants, one line each
	Notes      []string // lines worth reading that are not violations
	// Pending: work is still in flight (rows processing, events unpublished, ledger keys
	// with no outcome yet); `verify --wait` waits while any plugin reports it.
	Pending bool
	// Result: the plugin's key=value pairs of the RESULT line (`verify --result`), after
	// the ledger's orders= and deliveries=.
	Result string
}

package inbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// VerifyEnv is what a plugin's Verify receives from `router verify`.
//
// A Verify that checks every done inbox row of its biz type against its effects leaves out
// the rows an operator resolved with `router inbox resolve`: they are done, with reason
// 'resolved', and have no effect of their own.
type VerifyEnv struct {
	DB *sql.DB // the application pool
	// Settings are the plugin's decoded settings, as PluginEnv.Settings.
	Settings any
	// Keys are the business keys of the producer ledgers given to `verify --ledger`, as
	// `router produce --ledger` wrote them. Each should have ended processed or
	// quarantined. Keys is empty without a ledger.
	Keys []string
	// LagBound is relay.lag_bound. Outbox rows unpublished for longer are a violation.
	LagBound time.Duration
	// ReadTopic reads every committed record of a topic, as read_committed, to count the
	// events that reached Kafka. It is nil unless `verify --kafka` was given.
	ReadTopic func(ctx context.Context, topic string) ([]kafkax.Record, error)
}

// Verification is what a plugin's Verify found. `router verify` prints the summary and the
// notes, one VIOLATION line per violation, and exits 1 when there is one.
type Verification struct {
	Summary    string   // one line of counts, key=value pairs
	Violations []string // broken invariants, one line each
	Notes      []string // lines worth reading that are not violations
	// Pending reports that work is still in flight. Rows may be processing, events
	// unpublished, or ledger keys without an outcome yet. `verify --wait` waits while any
	// plugin reports it.
	Pending bool
	// Result holds the plugin's key=value pairs of the RESULT line of `verify --result`.
	// They follow the ledger's orders= and deliveries=.
	Result string
}

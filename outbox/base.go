package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// relayBase is what both engines of a Relay share. It holds the configuration, the
// database, the counters and the wake-ups. It runs the idle and backoff loop, the retention
// cleanup and the parking of parked.go.
type relayBase struct {
	db     *sql.DB
	dl     sqlText // the pool's dialect
	cfg    RelayConfig
	logger watermill.LoggerAdapter
	q      relayQueries
	tr     trace.Tracer // nil when the relay does not trace, see RelayConfig.TracerProvider

	checkMu sync.Mutex  // serialises checkServer
	checked atomic.Bool // checkServer succeeded

	published atomic.Int64
	parked    atomic.Int64
	parkLog   parkLog // counts parked rows by reason and logs them
	batches   atomic.Int64
	lingers   atomic.Int64
	failures  atomic.Int64
	deleted   atomic.Int64
	wakes     atomic.Int64

	wakeMu sync.Mutex
	wakeCh chan struct{} // closed by Wake, replaced once a loop has seen it closed
	woken  bool
}

type relayQueries struct {
	oldestPending, markPrefix string
	cleanup                   string
	parkedKeys                string
}

// newRelayBase fills cfg's defaults, checks it and prepares the shared queries.
func newRelayBase(db *sql.DB, cfg RelayConfig, logger watermill.LoggerAdapter) (*relayBase, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	t := cfg.Table
	d := sqlText{dbx.DialectOf(db)}
	return &relayBase{db: db, dl: d, cfg: cfg, logger: logger, tr: tracex.Tracer(cfg.TracerProvider, tracerScope), q: relayQueries{
		oldestPending: fmt.Sprintf(`SELECT MIN(created_at) FROM %s WHERE published_at IS NULL`, t),
		markPrefix:    fmt.Sprintf(`UPDATE %s SET published_at = %s WHERE `, t, d.now()),
		cleanup:       d.Rebind(d.deleteLimit(t, "published_at < "+d.now()+" - "+d.micros(), cfg.CleanupBatch)),
		parkedKeys:    fmt.Sprintf(`SELECT msg_key, COALESCE(held_behind, event_id) FROM %s ORDER BY id`, parkedTable(t)),
	}}, nil
}

// Wake tells an idle relay that rows were just committed, so it reads them now instead of
// after its poll interval. The router calls it after every delivery that committed work.
// It never blocks. Many calls between two reads cost one read.
func (r *relayBase) Wake() {
	r.wakeMu.Lock()
	if !r.woken {
		if r.wakeCh == nil {
			r.wakeCh = make(chan struct{})
		}
		close(r.wakeCh)
		r.woken = true
	}
	r.wakeMu.Unlock()
}

// Wakes returns how many idle waits Wake cut short.
func (r *relayBase) Wakes() int64 { return r.wakes.Load() }

// wakeC returns the channel the next Wake closes.
func (r *relayBase) wakeC() <-chan struct{} {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	if r.wakeCh == nil || r.woken {
		r.wakeCh, r.woken = make(chan struct{}), false
	}
	return r.wakeCh
}

// Published is the number of events this relay has published.
func (r *relayBase) Published() int64 { return r.published.Load() }

// Batches is the number of batches this relay has published. A batch is a Kafka
// transaction in exactly-once mode and a SendMessages call in at-least-once mode.
func (r *relayBase) Batches() int64 { return r.batches.Load() }

// Parked is the number of rows this relay has moved to the parked table. They are the
// events Kafka refuses for good and the later events of their keys, held behind them.
func (r *relayBase) Parked() int64 { return r.parked.Load() }

// Lingers is the number of times a partial batch waited Linger for more rows.
func (r *relayBase) Lingers() int64 { return r.lingers.Load() }

// Failures is the number of failed batches. Each was retried.
func (r *relayBase) Failures() int64 { return r.failures.Load() }

// Deleted is the number of published rows the retention cleanup has deleted.
func (r *relayBase) Deleted() int64 { return r.deleted.Load() }

// checkServer makes CheckServer's checks once, and again after a failure. It checks the
// pool's isolation, then calls complete, the engine's own part, if it is not nil. complete
// runs under checkMu and before checked is set.
func (r *relayBase) checkServer(ctx context.Context, complete func(context.Context) error) error {
	if r.checked.Load() {
		return nil
	}
	r.checkMu.Lock()
	defer r.checkMu.Unlock()
	if r.checked.Load() {
		return nil
	}
	if err := dbx.CheckIsolation(ctx, r.db); err != nil {
		return fmt.Errorf("outbox relay: %w", err)
	}
	if complete != nil {
		if err := complete(ctx); err != nil {
			return err
		}
	}
	r.checked.Store(true)
	return nil
}

// batches is what loop runs: the batches of the at-least-once relay, or of one shard of the
// exactly-once relay.
type batches interface {
	// batch publishes one batch and returns how many rows it published.
	batch(ctx context.Context) (int, error)
	// idleWait is how long to wait after a batch that found nothing to publish.
	idleWait() time.Duration
	// cleans reports whether this loop runs the retention cleanup.
	cleans() bool
	// wakeable reports whether an idle wait ends early on Wake, which means that the loop
	// publishes.
	wakeable() bool
	// idleMax is the longest idle wait of a wakeable loop, IdlePollMax or less.
	idleMax() time.Duration
}

// loop runs b's batches until ctx ends. It backs off after failures and sleeps for
// b.idleWait() when there was nothing to publish.
//
// An idle wait ends early on Wake when b.wakeable() reports true. Such a wait doubles with
// each read in a row that found nothing, up to b.idleMax() (idleWaitAfter). A wait never
// ends early for a standby or while backing off after a failure.
func (r *relayBase) loop(ctx context.Context, shard string, b batches) {
	backoff := r.cfg.RetryBackoff
	idle := 0 // reads in a row that found nothing, while wakeable
	var nextCleanup time.Time
	defer r.parkLog.flush(r.logger, true)
	for {
		woke := r.wakeC() // taken before the read, so a Wake during it cuts the next wait short
		n, err := b.batch(ctx)
		r.parkLog.flush(r.logger, false)
		if ctx.Err() != nil {
			return
		}
		wait := time.Duration(0)
		switch {
		case err != nil:
			r.failures.Add(1)
			fields := watermill.LogFields{"backoff": backoff.String()}
			if shard != "" {
				fields["shard"] = shard
			}
			r.logger.Error("outbox relay batch failed, will retry", err, fields)
			wait = backoff
			backoff = min(2*backoff, max(r.cfg.MaxRetryBackoff, r.cfg.RetryBackoff))
		case n == 0:
			backoff = r.cfg.RetryBackoff
			wait = b.idleWait()
			if b.wakeable() {
				wait = idleWaitAfter(wait, idle, b.idleMax())
				idle++
			}
		default:
			backoff = r.cfg.RetryBackoff
		}
		if n != 0 || err != nil {
			idle = 0
		}
		if r.cfg.Retention > 0 && time.Now().After(nextCleanup) && b.cleans() {
			if _, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.logger.Error("outbox cleanup failed, will retry", err, nil)
			}
			nextCleanup = time.Now().Add(r.cfg.CleanupInterval)
		}
		if wait > 0 {
			var wake <-chan struct{}
			if err == nil && b.wakeable() {
				wake = woke
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-wake:
				// Rows committed since the read, so read again now. A partial batch lingers
				// in the read itself. So a burst of wakes, one per delivery, still costs one
				// batch. A woken row waits one Linger, and the wake adds no wait of its own.
				t.Stop()
				r.wakes.Add(1)
				idle = 0
			}
		}
	}
}

// idleWaitAfter is the wait of a wakeable loop after idle reads in a row found nothing
// before this one: base doubled idle times, up to limit, and never below base.
func idleWaitAfter(base time.Duration, idle int, limit time.Duration) time.Duration {
	if limit <= base {
		return base
	}
	w := base
	for range idle {
		if w >= limit/2 {
			return limit
		}
		w *= 2
	}
	return w
}

// Cleanup deletes published rows older than the retention, CleanupBatch rows per statement,
// and returns how many it deleted. It never touches unpublished rows.
func (r *relayBase) Cleanup(ctx context.Context) (int64, error) {
	if r.cfg.Retention <= 0 {
		return 0, nil
	}
	var total int64
	for {
		res, err := r.db.ExecContext(ctx, r.q.cleanup, r.cfg.Retention.Microseconds())
		if err != nil {
			return total, fmt.Errorf("delete published outbox rows: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, err
		}
		total += n
		r.deleted.Add(n)
		if n < int64(r.cfg.CleanupBatch) {
			return total, nil
		}
	}
}

func (r *relayBase) hook(point string) {
	if r.cfg.Hook != nil {
		r.cfg.Hook(point)
	}
}

// linger reports whether a read that found n pending rows should wait for more. If so, it
// waits Linger, or returns ctx's error if ctx ends first. The caller then reads again from
// the start. So rows that committed out of id order meanwhile take their place in id order.
func (r *relayBase) linger(ctx context.Context, n int) (bool, error) {
	if r.cfg.Linger <= 0 || n == 0 || n >= r.cfg.BatchSize {
		return false, nil
	}
	r.lingers.Add(1)
	r.hook("linger")
	t := time.NewTimer(r.cfg.Linger)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-t.C:
		return true, nil
	}
}

// logParked counts what park moved and logs it, one line per run of parked events.
func (r *relayBase) logParked(moved []parkEntry, shard string) {
	r.parked.Add(int64(len(moved)))
	r.parkLog.add(r.logger, moved, shard)
}

// ParkedBy returns how many rows this relay has moved to the parked table, by reason. The
// reasons are those of Kafka's refusals and ReasonHeld.
func (r *relayBase) ParkedBy() map[string]int64 { return r.parkLog.parkedBy() }

// The fixed header names as bytes, shared by every message. The producer only reads them.
var (
	headerEventIDKey   = []byte(HeaderEventID)
	headerEventTypeKey = []byte(HeaderEventType)
	headerTraceKey     = []byte(tracex.Header)
)

// OldestPendingAge returns the age of the oldest unpublished row, or 0 when there is none.
func (r *relayBase) OldestPendingAge(ctx context.Context) (time.Duration, error) {
	var t sql.NullTime
	if err := r.db.QueryRowContext(ctx, r.q.oldestPending).Scan(&t); err != nil {
		return 0, fmt.Errorf("oldest pending outbox row: %w", err)
	}
	if !t.Valid {
		return 0, nil
	}
	return max(time.Since(t.Time), 0), nil
}

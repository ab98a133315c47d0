package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// LeaseTable is the table of shard leases, created by migration 00003.
const LeaseTable = "relay_lease"

// lease is one relay's claim on an outbox shard. It is a row in relay_lease that its owner
// renews in short autocommit statements. The database's clock sets expires_at. Another
// instance takes the shard over once expires_at has passed. The owner's own view is
// conservative, because validUntil counts from before the renewing statement was sent.
type lease struct {
	db         *sql.DB
	shard      string
	owner      string
	ttl        time.Duration
	held       bool
	validUntil time.Time
	renewed    time.Time
	q          struct{ acquire, insert, release, who string }
}

func newLease(db *sql.DB, shard, owner string, ttl time.Duration) *lease {
	l := &lease{db: db, shard: shard, owner: owner, ttl: ttl}
	d := sqlText{dbx.DialectOf(db)}
	// takeovers and acquired_at are assigned before owner. MariaDB evaluates SET left to
	// right, so they still see the previous owner. PostgreSQL's SET always sees the old row.
	l.q.acquire = d.Rebind(`UPDATE ` + LeaseTable + ` SET takeovers = takeovers + CASE WHEN owner = ? THEN 0 ELSE 1 END,
 acquired_at = CASE WHEN owner = ? THEN acquired_at ELSE ` + d.now() + ` END, owner = ?, expires_at = ` + d.now() + ` + ` + d.micros() + `
 WHERE shard = ? AND (owner = ? OR expires_at < ` + d.now() + `)`)
	l.q.insert = `INSERT INTO ` + LeaseTable + ` (shard, owner, expires_at) VALUES (?, '', ` + d.now() + ` - INTERVAL '1' SECOND)`
	if d.IsPostgres() {
		l.q.insert = d.Rebind(l.q.insert + ` ON CONFLICT (shard) DO NOTHING`)
	} else {
		l.q.insert += ` ON DUPLICATE KEY UPDATE shard = shard`
	}
	l.q.release = d.Rebind(`UPDATE ` + LeaseTable + ` SET expires_at = ` + d.now() + ` - ` + d.micros() + ` WHERE shard = ? AND owner = ?`)
	l.q.who = d.Rebind(`SELECT owner, expires_at > ` + d.now() + ` FROM ` + LeaseTable + ` WHERE shard = ?`)
	return l
}

// valid reports whether this instance holds the lease by its own conservative clock.
func (l *lease) valid() bool { return l.held && time.Now().Before(l.validUntil) }

// due reports whether the lease should be renewed now. It is renewed every ttl/4.
func (l *lease) due() bool { return !l.valid() || time.Since(l.renewed) >= l.ttl/4 }

// acquire takes or renews the lease. It returns whether this instance holds it; changed is
// true when that differs from before.
func (l *lease) acquire(ctx context.Context) (held, changed bool, err error) {
	was := l.held
	for attempt := 0; attempt < 2; attempt++ {
		t0 := time.Now()
		res, err := l.db.ExecContext(ctx, l.q.acquire, l.owner, l.owner, l.owner, l.ttl.Microseconds(), l.shard, l.owner)
		if err != nil {
			return l.held && l.valid(), false, fmt.Errorf("relay lease %s: %w", l.shard, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return l.valid(), false, err
		}
		if n == 1 {
			l.held, l.validUntil, l.renewed = true, t0.Add(l.ttl), t0
			return true, !was, nil
		}
		if attempt == 0 {
			// There is no row yet, or someone else holds it. Make sure the row exists and try
			// once more.
			if _, err := l.db.ExecContext(ctx, l.q.insert, l.shard); err != nil {
				return false, was, fmt.Errorf("relay lease %s: %w", l.shard, err)
			}
		}
	}
	l.held = false
	return false, was, nil
}

// holder returns the current owner of the shard and whether its lease is live.
func (l *lease) holder(ctx context.Context) (owner string, live bool, err error) {
	err = l.db.QueryRowContext(ctx, l.q.who, l.shard).Scan(&owner, &live)
	if err == sql.ErrNoRows {
		return "", false, nil
	}
	return owner, live, err
}

// release gives the lease up. A standby may take it at once.
func (l *lease) release(ctx context.Context) error {
	if !l.held {
		return nil
	}
	l.held = false
	if _, err := l.db.ExecContext(ctx, l.q.release, 1, l.shard, l.owner); err != nil {
		return fmt.Errorf("release relay lease %s: %w", l.shard, err)
	}
	return nil
}

// lose forgets the lease locally, after a failed renewal or a fenced session.
func (l *lease) lose() { l.held = false }

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "relay"
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randHex(3))
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

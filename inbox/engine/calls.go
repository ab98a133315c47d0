package engine

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Outside calls take one path per key.
//
// An inbox.Preparer's Prepare calls outside services, outside any transaction. Several
// paths can run one key. They are the partition's delivery, a duplicate of it, the delayed
// redeliverer, a replay, a console retry and another router. Before a path calls Prepare
// for a key it takes the key's call lease. The lease is a row of inbox_call, owned by one
// Inbox at a time, and inside that Inbox by one path at a time.
//
// Once the lease is held, the path reads the key's inbox row. A row that is done, or failed
// and not reopened by this path, makes no call. The transaction that marks the row done
// deletes the lease row, and fails when the lease is no longer this Inbox's. So a path that
// takes the lease after that commit finds the row done, and no path calls out for the key
// again.
//
// The owner renews its leases while it holds them. A lease of a router that died or froze
// expires after Config.CallLease, and another path may take it then. The frozen router's
// transaction cannot commit the key any more.
//
// A Prepare abandoned at inbox.handler_timeout keeps the key's lease until it returns. So two
// calls for one key never overlap in time.

// CallTable is the table of the keys' call leases. Migration 00016 creates it, and
// migration 00004 on PostgreSQL.
const CallTable = "inbox_call"

// errLeaseLost is the error of a transaction whose key's call lease is no longer its Inbox's.
// The delivery runs again. It waits for the lease, then finds the row as the new owner left
// it.
var errLeaseLost = errors.New("inbox: the key's call lease was taken over")

// errRowMoved is the error of a transaction that found its row in another state than the one
// that made its path skip the outside calls. The delivery runs again.
var errRowMoved = errors.New("inbox: the key's row changed after it was read")

// callLeases are the call leases of one Inbox.
type callLeases struct {
	ib    *Inbox
	owner string
	ttl   time.Duration

	mu       sync.Mutex
	held     map[string]*keyHold // keys held by a path of this Inbox
	renewing bool                // a renewer goroutine runs

	take, read, renew, release, expire string
	releaseIn                          string // DELETE of a batch's leases, ending with "IN "
	check                              string // a step's check that the lease is still this Inbox's
}

// keyHold is a key held by one path of an Inbox.
type keyHold struct {
	free  chan struct{} // closed once released
	calls int           // Prepare calls still running, an abandoned one included
	ended bool          // the path is done with the key
	db    bool          // the database lease row may be this Inbox's
}

// callHold is a path's hold of a key's call lease. A nil *callHold holds nothing.
type callHold struct {
	l   *callLeases
	key string
	h   *keyHold
}

func newCallLeases(ib *Inbox) *callLeases {
	d, t := ib.d, ib.cfg.Table
	now, micros := "NOW(6)", "INTERVAL ? MICROSECOND"
	if d.IsPostgres() {
		now, micros = "(statement_timestamp() AT TIME ZONE 'UTC')", "(? * INTERVAL '1 microsecond')"
	}
	l := &callLeases{ib: ib, owner: leaseOwner(), ttl: ib.cfg.CallLease, held: map[string]*keyHold{}}
	ins := `INSERT INTO ` + CallTable + ` (biz_type, dedup_key, owner, expires_at) VALUES (?, ?, ?, ` + now + ` + ` + micros + `)`
	if d.IsPostgres() {
		l.take = ins + ` ON CONFLICT (biz_type, dedup_key) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at,
 acquired_at = CASE WHEN ` + CallTable + `.owner = EXCLUDED.owner THEN ` + CallTable + `.acquired_at ELSE ` + now + ` END
 WHERE ` + CallTable + `.owner = EXCLUDED.owner OR ` + CallTable + `.expires_at < ` + now
	} else {
		// The columns are assigned left to right. owner is set from the old values. The
		// rest change only when owner is now this Inbox, because an owner token is one
		// Inbox's alone.
		l.take = ins + ` ON DUPLICATE KEY UPDATE owner = IF(owner = VALUES(owner) OR expires_at < ` + now + `, VALUES(owner), owner),
 acquired_at = IF(owner = VALUES(owner) AND expires_at < ` + now + `, ` + now + `, acquired_at),
 expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)`
	}
	l.read = `SELECT c.owner, i.id, i.status, i.fingerprint, i.reason FROM ` + CallTable + ` c LEFT JOIN ` + t +
		` i ON i.dedup_key = c.dedup_key AND i.biz_type = c.biz_type WHERE c.biz_type = ? AND c.dedup_key = ?`
	l.renew = `UPDATE ` + CallTable + ` SET expires_at = ` + now + ` + ` + micros + ` WHERE owner = ?`
	l.release = `DELETE FROM ` + CallTable + ` WHERE biz_type = ? AND dedup_key = ? AND owner = ?`
	l.releaseIn = `DELETE FROM ` + CallTable + ` WHERE biz_type = ? AND owner = ? AND dedup_key IN `
	l.check = `SELECT owner FROM ` + CallTable + ` WHERE biz_type = ? AND dedup_key = ? FOR UPDATE`
	// expire deletes rows of routers that died holding a lease, long expired, on keys
	// never seen again.
	l.expire = `DELETE FROM ` + CallTable + ` WHERE expires_at < ` + now + ` - ` + micros
	for _, s := range []*string{&l.take, &l.read, &l.renew, &l.release, &l.check, &l.expire} {
		*s = d.Rebind(*s)
	}
	return l
}

// leaseOwner is a token naming this Inbox among every Inbox of every process. It is made of
// the host, the process id and random bytes.
func leaseOwner() string {
	host, _ := os.Hostname()
	if len(host) > 24 {
		host = host[:24]
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// acquire waits until key is held by no other path of this Inbox, then holds it.
func (l *callLeases) acquire(ctx context.Context, key string) (*keyHold, error) {
	for {
		l.mu.Lock()
		h := l.held[key]
		if h == nil {
			h = &keyHold{free: make(chan struct{})}
			l.held[key] = h
			if !l.renewing {
				l.renewing = true
				go l.renewLoop()
			}
			l.mu.Unlock()
			return h, nil
		}
		l.mu.Unlock()
		select {
		case <-h.free:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Take waits for key's call lease. It waits first for the other paths of this Inbox, then
// for other Inboxes, such as other routers or a replay. It returns the hold and the key's
// inbox row as it is once the lease is held. found is false when there is no row. Take
// waits at most inbox.handler_timeout. Its error then wraps ErrHandlerTimeout. A call
// still running elsewhere, abandoned at its timeout and never returning, is one the key's
// delivery waits on.
func (l *callLeases) Take(ctx context.Context, key string) (*callHold, inboxRow, bool, error) {
	wctx, cancel := context.WithTimeout(ctx, l.ib.cfg.HandlerTimeout)
	defer cancel()
	h, err := l.acquire(wctx, key)
	if err != nil {
		return nil, inboxRow{}, false, l.waitError(ctx, wctx, key)
	}
	ch := &callHold{l: l, key: key, h: h}
	wait := 10 * time.Millisecond
	for {
		row, found, owner, err := l.takeOnce(wctx, key, h)
		if err == nil && owner == l.owner {
			return ch, row, found, nil
		}
		if err != nil && wctx.Err() == nil && !dbx.IsLockConflict(err) {
			ch.End()
			return nil, inboxRow{}, false, fmt.Errorf("inbox %s: take the call lease of %q: %w", l.ib.cfg.BizType, key, err)
		}
		// Another Inbox holds it, so wait for its release or its expiry.
		sleep(wctx, wait)
		if wctx.Err() != nil {
			ch.End()
			return nil, inboxRow{}, false, l.waitError(ctx, wctx, key)
		}
		wait = min(2*wait, time.Second)
	}
}

// waitError is the error of a Take that waited until wctx ended. It is ctx's own end, else
// a timeout.
func (l *callLeases) waitError(ctx, wctx context.Context, key string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("waiting for key %q's outside calls: %w", key, ctx.Err())
	}
	return fmt.Errorf("waiting for key %q's outside calls, still made by another path: %w", key, ErrHandlerTimeout)
}

// takeOnce tries to take key's lease for h once. It returns the row's owner after the try
// and the key's inbox row.
func (l *callLeases) takeOnce(ctx context.Context, key string, h *keyHold) (inboxRow, bool, string, error) {
	var row inboxRow
	if _, err := l.ib.db.ExecContext(ctx, l.take, l.ib.cfg.BizType, key, l.owner, l.ttl.Microseconds()); err != nil {
		return row, false, "", err
	}
	// The row may be this Inbox's now, so End deletes it. The delete names the owner.
	l.mu.Lock()
	h.db = true
	l.mu.Unlock()
	var owner string
	var id sql.NullInt64
	var status, fp sql.NullString
	if err := l.ib.db.QueryRowContext(ctx, l.read, l.ib.cfg.BizType, key).Scan(&owner, &id, &status, &fp, &row.reason); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return row, false, "", nil // released between the two statements, so take it again
		}
		return row, false, "", err
	}
	row.id, row.status, row.fingerprint = id.Int64, Status(status.String), storedFingerprint(fp.String)
	return row, id.Valid, owner, nil
}

// Begin counts a Prepare call starting under the hold. CallEnded counts its end.
func (c *callHold) Begin() {
	if c == nil {
		return
	}
	c.l.mu.Lock()
	c.h.calls++
	c.l.mu.Unlock()
}

// CallEnded counts a Prepare call returned. The last one of a path that ended releases the key.
func (c *callHold) CallEnded() {
	if c == nil {
		return
	}
	c.l.mu.Lock()
	c.h.calls--
	last := c.h.calls == 0 && c.h.ended
	c.l.mu.Unlock()
	if last {
		c.l.free(c.key, c.h)
	}
}

// Deleted records that a committed transaction deleted the lease row, by ReleaseTx or by a
// batch's releaseBatch.
func (c *callHold) Deleted() {
	if c == nil {
		return
	}
	c.l.mu.Lock()
	c.h.db = false
	c.l.mu.Unlock()
}

// End ends the path's hold. Once every call the path started has returned, the key is free
// for this Inbox's other paths. Once the lease row is deleted too, it is free for other
// Inboxes. End does not wait for that.
func (c *callHold) End() {
	if c == nil {
		return
	}
	c.l.mu.Lock()
	c.h.ended = true
	now := c.h.calls == 0
	c.l.mu.Unlock()
	if now {
		c.l.free(c.key, c.h)
	}
}

// free deletes a key's lease row if it is still held, then lets this Inbox's next path in.
func (l *callLeases) free(key string, h *keyHold) {
	l.mu.Lock()
	db := h.db
	l.mu.Unlock()
	if !db {
		l.forget(key, h)
		return
	}
	go func() {
		// The next path of this Inbox waits for the delete. With the same owner, it would
		// take the row over and lose it to this delete.
		for try := 0; ; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := l.ib.db.ExecContext(ctx, l.release, l.ib.cfg.BizType, key, l.owner)
			cancel()
			if err == nil || try >= 5 {
				if err != nil {
					// The row stays until it expires, and other routers wait that long for
					// the key.
					l.ib.logger.Error("inbox: release a key's call lease", err, watermill.LogFields{l.ib.cfg.KeyLogField: key})
				}
				break
			}
			time.Sleep(time.Duration(100*(try+1)) * time.Millisecond)
		}
		l.mu.Lock()
		h.db = false
		l.mu.Unlock()
		l.forget(key, h)
	}()
}

func (l *callLeases) forget(key string, h *keyHold) {
	l.mu.Lock()
	if l.held[key] == h {
		delete(l.held, key)
	}
	l.mu.Unlock()
	close(h.free)
}

// ReleaseTx deletes the lease row in tx, the transaction that finishes the key. It fails
// with errLeaseLost when the lease is no longer this Inbox's. Once tx committed, call
// Deleted.
func (c *callHold) ReleaseTx(ctx context.Context, tx *sql.Tx) error {
	if c == nil {
		return nil
	}
	r, err := tx.ExecContext(ctx, c.l.release, c.l.ib.cfg.BizType, c.key, c.l.owner)
	if err != nil {
		return fmt.Errorf("release the call lease of %q: %w", c.key, err)
	}
	if n, err := r.RowsAffected(); err != nil || n != 1 {
		return errLeaseLost
	}
	return nil
}

// CheckTx checks in tx that the lease is still this Inbox's, and locks it until tx ends. So
// a step that leaves the key unfinished commits only while it holds the lease.
func (c *callHold) CheckTx(ctx context.Context, tx *sql.Tx) error {
	if c == nil {
		return nil
	}
	var owner string
	err := tx.QueryRowContext(ctx, c.l.check, c.l.ib.cfg.BizType, c.key).Scan(&owner)
	if errors.Is(err, sql.ErrNoRows) || err == nil && owner != c.l.owner {
		return errLeaseLost
	}
	if err != nil {
		return fmt.Errorf("check the call lease of %q: %w", c.key, err)
	}
	return nil
}

// releaseBatch deletes the lease rows of holds in tx, a batch's transaction. It fails with
// errLeaseLost when one of them is no longer this Inbox's.
func (l *callLeases) releaseBatch(ctx context.Context, tx *sql.Tx, holds []*callHold) error {
	if len(holds) == 0 {
		return nil
	}
	args := make([]any, 0, len(holds)+2)
	args = append(args, l.ib.cfg.BizType, l.owner)
	for _, h := range holds {
		args = append(args, h.key)
	}
	r, err := tx.ExecContext(ctx, l.ib.d.Rebind(l.releaseIn+placeholders(len(holds))), args...)
	if err != nil {
		return fmt.Errorf("release %d call leases: %w", len(holds), err)
	}
	if n, err := r.RowsAffected(); err != nil || n != int64(len(holds)) {
		return errLeaseLost
	}
	return nil
}

// renewLoop renews this Inbox's lease rows every third of their time to live while it holds
// any, and deletes rows long expired now and then. It ends once no key is held.
func (l *callLeases) renewLoop() {
	every := l.ttl / 3
	t := time.NewTicker(every)
	defer t.Stop()
	lastExpire := time.Time{}
	for range t.C {
		l.mu.Lock()
		if len(l.held) == 0 {
			l.renewing = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), every)
		if _, err := l.ib.db.ExecContext(ctx, l.renew, l.ttl.Microseconds(), l.owner); err != nil {
			l.ib.logger.Error("inbox: renew the keys' call leases", err, nil)
		}
		if time.Since(lastExpire) > time.Minute {
			lastExpire = time.Now()
			if _, err := l.ib.db.ExecContext(ctx, l.expire, (time.Hour + l.ttl).Microseconds()); err != nil {
				l.ib.logger.Error("inbox: delete expired call leases", err, nil)
			}
		}
		cancel()
	}
}

// mayCall reports whether a path that holds a key's call lease may make its outside calls.
// It may not for a row that is done or another message's. Nor may it for a quarantined
// row, unless the path reopens it.
func mayCall(found bool, row inboxRow, dec decoded, opts runOpts) bool {
	if !found {
		return true
	}
	reopen := opts.Reopen && (!opts.redelivery || Reason(row.reason.String) == ReasonDelayed)
	return decideClaim(false, row, dec.Fingerprint, opts.ReplayID == 0 && !opts.redelivery, reopen) == claimResume
}

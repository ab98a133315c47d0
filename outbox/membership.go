package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// MemberTable lists the live relays of each shard group. Migration 00005 creates it.
const MemberTable = "relay_member"

// ErrShardCountMismatch is wrapped by the error a relay returns when relays of one shard
// group run with different shard counts. Their shards overlap, so none of them may publish.
// Changing relay.shards needs a drained outbox and every relay of the old count stopped.
var ErrShardCountMismatch = errors.New("outbox relay: relays of this shard group run with different relay.shards")

// membership spreads the shards of a group over its live relays. Each relay renews its row
// in relay_member every LeaseTTL/4, and the row expires after LeaseTTL. The relay reads the
// live members ordered by owner. It wants each shard i for which members[i mod
// len(members)] is itself.
//
// At its next batch, a relay hands over a shard it no longer wants. It ends the shard's
// session and releases the lease. It takes a shard it wants through the lease as soon as
// the lease is free. So a dead relay's shards move to the others once its lease and its
// membership have expired. Two relays may see different members for a moment. At worst both
// want a shard, and the lease decides. Or neither wants it, and it waits one refresh.
type membership struct {
	r  *eosRelay
	mu sync.Mutex // serialises refresh and leave

	refreshed time.Time
	view      string // last logged assignment
	q         struct{ upsert, list, leave, purge string }
}

func newMembership(r *eosRelay) *membership {
	m := &membership{r: r}
	d := r.dl
	m.q.upsert = `INSERT INTO ` + MemberTable + ` (grp, owner, shards, expires_at) VALUES (?, ?, ?, ` + d.now() + ` + ` + d.micros() + `)`
	if d.IsPostgres() {
		m.q.upsert += ` ON CONFLICT (grp, owner) DO UPDATE SET shards = EXCLUDED.shards, expires_at = EXCLUDED.expires_at`
	} else {
		m.q.upsert += ` ON DUPLICATE KEY UPDATE shards = VALUES(shards), expires_at = VALUES(expires_at)`
	}
	m.q.upsert = d.Rebind(m.q.upsert)
	m.q.list = d.Rebind(`SELECT owner, shards FROM ` + MemberTable + ` WHERE grp = ? AND expires_at > ` + d.now() + ` ORDER BY owner`)
	m.q.leave = d.Rebind(`DELETE FROM ` + MemberTable + ` WHERE grp = ? AND owner = ?`)
	m.q.purge = d.Rebind(`DELETE FROM ` + MemberTable + ` WHERE grp = ? AND expires_at < ` + d.now() + ` - INTERVAL '1' DAY`)
	return m
}

func (m *membership) every() time.Duration { return m.r.cfg.LeaseTTL / 4 }

// due reports whether the membership should be renewed now.
func (m *membership) due() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Since(m.refreshed) >= m.every()
}

// run refreshes the membership every LeaseTTL/4 until ctx ends.
func (m *membership) run(ctx context.Context) {
	t := time.NewTicker(m.every())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := m.refresh(ctx); err != nil && ctx.Err() == nil {
				m.r.logger.Error("outbox relay membership refresh failed, will retry", err, watermill.LogFields{"group": m.r.cfg.Shard})
			}
		}
	}
}

// refresh renews this relay's membership and recomputes which shards it wants. On an
// error the previous assignment stays. If the database is gone for good, the leases expire
// on their own.
func (m *membership) refresh(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cfg := m.r.cfg
	t0 := time.Now()
	if _, err := m.r.db.ExecContext(ctx, m.q.upsert, cfg.Shard, cfg.Owner, cfg.Shards, cfg.LeaseTTL.Microseconds()); err != nil {
		return fmt.Errorf("relay membership %s: %w", cfg.Shard, err)
	}
	members, others, err := m.list(ctx)
	if err != nil {
		return err
	}
	m.refreshed = t0
	if len(others) > 0 {
		for _, e := range m.r.shards {
			e.wanted.Store(false)
		}
		view := fmt.Sprintf("mismatch %v", others)
		if view != m.view {
			m.view = view
			m.r.logger.Error("outbox relay: not publishing, live relays of this shard group run with another relay.shards (change it only with a drained outbox and all relays of the old count stopped)",
				ErrShardCountMismatch, watermill.LogFields{"group": cfg.Shard, "shards": cfg.Shards, "others": fmt.Sprint(others)})
		}
		return nil
	}
	if !slices.Contains(members, cfg.Owner) {
		members = append(members, cfg.Owner) // just renewed: only a clock step hides it
		slices.Sort(members)
	}
	var owned []int
	for _, e := range m.r.shards {
		want := members[e.index%len(members)] == cfg.Owner
		e.wanted.Store(want)
		if want {
			owned = append(owned, e.index)
		}
	}
	if view := fmt.Sprint(owned, members); view != m.view {
		m.view = view
		m.r.logger.Info("outbox relay shards assigned", watermill.LogFields{"group": cfg.Shard, "owner": cfg.Owner,
			"shards": fmt.Sprint(owned), "of": cfg.Shards, "members": len(members)})
	}
	_, _ = m.r.db.ExecContext(ctx, m.q.purge, cfg.Shard)
	return nil
}

// list returns the live members with this relay's shard count. It returns the others
// apart, each written as owner(shards).
func (m *membership) list(ctx context.Context) (members, others []string, err error) {
	rows, err := m.r.db.QueryContext(ctx, m.q.list, m.r.cfg.Shard)
	if err != nil {
		return nil, nil, fmt.Errorf("relay membership %s: %w", m.r.cfg.Shard, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			owner  string
			shards int
		)
		if err := rows.Scan(&owner, &shards); err != nil {
			return nil, nil, err
		}
		if shards == m.r.cfg.Shards {
			members = append(members, owner)
		} else {
			others = append(others, fmt.Sprintf("%s(%d)", owner, shards))
		}
	}
	return members, others, rows.Err()
}

// leave deletes this relay's membership so the others take its shards at their next
// refresh.
func (m *membership) leave(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.r.shards {
		e.wanted.Store(false)
	}
	m.view = ""
	m.refreshed = time.Time{}
	if _, err := m.r.db.ExecContext(ctx, m.q.leave, m.r.cfg.Shard, m.r.cfg.Owner); err != nil {
		return fmt.Errorf("leave relay membership %s: %w", m.r.cfg.Shard, err)
	}
	return nil
}

// checkShardCount refuses a session while a live lease of this shard group belongs to
// another shard count. Relays with different counts would publish overlapping rows under
// different transactional ids, and nothing would fence one from the other. The check covers
// relays with one shard, which keep no membership. Each relay takes its lease before it
// checks, so of two relays starting together at least one sees the other.
func (e *eosShard) checkShardCount(ctx context.Context) error {
	group, n := e.r.cfg.Shard, e.r.cfg.Shards
	rows, err := e.r.db.QueryContext(ctx, `SELECT shard, owner FROM `+LeaseTable+` WHERE expires_at > `+e.r.dl.now())
	if err != nil {
		return fmt.Errorf("relay leases: %w", err)
	}
	defer rows.Close()
	var others []string
	for rows.Next() {
		var name, owner string
		if err := rows.Scan(&name, &owner); err != nil {
			return err
		}
		if c := shardCountOf(group, name); c != 0 && c != n {
			others = append(others, fmt.Sprintf("%s (owner %s)", name, owner))
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(others) > 0 {
		return fmt.Errorf("%w: this relay has %d, live leases %v", ErrShardCountMismatch, n, others)
	}
	return nil
}

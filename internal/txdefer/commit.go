package txdefer

import (
	"context"
	"database/sql"
	"sync"
)

// Commit collects what is to run once a transaction has committed. The inbox's Batcher puts
// one for its batch's transaction in the handler's context. It calls Committed only when
// the commit succeeded, never after a rollback, nor after a commit that got no answer.
// outbox.Writer hands the events it wrote to its process's exactly-once relay this way, in
// outbox/handoff.go. So the relay need not read back rows it was handed.
//
// A batch whose deliveries run behind savepoints has no Commit. Otherwise a delivery rolled
// back to its savepoint would leave its rows' hooks behind.
type Commit struct {
	db  *sql.DB
	tx  *sql.Tx
	mu  sync.Mutex
	fns []func()
}

// NewCommit returns an empty Commit for tx, a transaction of pool db.
func NewCommit(db *sql.DB, tx *sql.Tx) *Commit { return &Commit{db: db, tx: tx} }

// Pool is the pool the transaction belongs to, which a *sql.Tx does not say.
func (c *Commit) Pool() *sql.DB { return c.db }

type commitKey struct{}

// WithCommit returns ctx carrying c.
func WithCommit(ctx context.Context, c *Commit) context.Context {
	return context.WithValue(ctx, commitKey{}, c)
}

// CommitFrom returns the Commit ctx carries for tx, or nil when ctx carries none or one of
// another transaction.
func CommitFrom(ctx context.Context, tx *sql.Tx) *Commit {
	c, _ := ctx.Value(commitKey{}).(*Commit)
	if c == nil || c.tx != tx || tx == nil {
		return nil
	}
	return c
}

// After adds fn, to run when the transaction has committed.
func (c *Commit) After(fn func()) {
	c.mu.Lock()
	c.fns = append(c.fns, fn)
	c.mu.Unlock()
}

// Committed runs the functions After added, in order and once, because the transaction
// committed.
func (c *Commit) Committed() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

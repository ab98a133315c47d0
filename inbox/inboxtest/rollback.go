package inboxtest

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

// injector rolls back the transactions of each key the handler finished. Of each key's
// transactions, max are rolled back, then one is let through to commit, then max again,
// and so on. Each step of a multi-step handler runs in a transaction of its own. So every
// step is rolled back max times before it commits, whatever the step index the inbox gives
// it on the retry.
type injector struct {
	max  int
	mu   sync.Mutex
	keys map[string]*keyState
	n    int
}

type keyState struct {
	tx     *sql.Tx // the last transaction let through (kept referenced: its address stays its own)
	streak int     // rollbacks since
}

// after is called once the handler finished d's work in tx. It returns
// ErrInjectedRollback when tx is to be rolled back. With StepsPerTx, a transaction let
// through may run more steps. A later call in it lets it through again.
func (in *injector) after(tx *sql.Tx, d *inbox.Delivery) error {
	if in.max <= 0 {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	k := in.keys[d.Key]
	if k == nil {
		k = &keyState{}
		in.keys[d.Key] = k
	}
	if tx == k.tx {
		return nil
	}
	if k.streak < in.max {
		k.streak++
		in.n++
		return fmt.Errorf("%w (key %q, step %d)", ErrInjectedRollback, d.Key, d.Step)
	}
	k.tx, k.streak = tx, 0
	return nil
}

func (in *injector) total() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.n
}

// wrap returns h with the rollbacks of in injected. The result implements the same
// optional interfaces the inbox looks for, Preparer and BatchHandler, and no others.
func wrap(h inbox.Handler, in *injector) inbox.Handler {
	b := &base{h: h, in: in}
	p, isPrep := h.(inbox.Preparer)
	bh, isBatch := h.(inbox.BatchHandler)
	switch {
	case isBatch && isPrep:
		return &batchWithPrepare{batch: &batch{base: b, b: bh}, p: p}
	case isBatch:
		return &batch{base: b, b: bh}
	case isPrep:
		return &withPrepare{base: b, p: p}
	}
	return b
}

type base struct {
	h  inbox.Handler
	in *injector
}

func (b *base) Decode(m *message.Message) (inbox.Decoded, error) { return b.h.Decode(m) }

func (b *base) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	p, err := b.h.Handle(ctx, tx, d)
	if err != nil {
		return p, err
	}
	if err := b.in.after(tx, d); err != nil {
		return p, err
	}
	return p, nil
}

type withPrepare struct {
	*base
	p inbox.Preparer
}

func (w *withPrepare) Prepare(ctx context.Context, d *inbox.Delivery) error {
	return w.p.Prepare(ctx, d)
}

type batch struct {
	*base
	b inbox.BatchHandler
}

// HandleBatch rolls the whole batch back when one of its deliveries' transactions is to be
// rolled back. The Batcher then runs each of them one at a time.
func (w *batch) HandleBatch(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	ps, err := w.b.HandleBatch(ctx, tx, ds)
	if err != nil {
		return ps, err
	}
	var injected error
	for _, d := range ds {
		if err := w.in.after(tx, d); err != nil && injected == nil {
			injected = err
		}
	}
	if injected != nil {
		return ps, injected
	}
	return ps, nil
}

type batchWithPrepare struct {
	*batch
	p inbox.Preparer
}

func (w *batchWithPrepare) Prepare(ctx context.Context, d *inbox.Delivery) error {
	return w.p.Prepare(ctx, d)
}

var (
	_ inbox.Preparer     = (*withPrepare)(nil)
	_ inbox.BatchHandler = (*batch)(nil)
	_ inbox.Preparer     = (*batchWithPrepare)(nil)
)

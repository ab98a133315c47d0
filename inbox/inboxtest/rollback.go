package inboxtest

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

// injector rolls back the first max transactions of each key and step that the handler
// finished.
type injector struct {
	max  int
	mu   sync.Mutex
	seen map[string]int
	n    int
}

// after is called once the handler finished d's work in its transaction: it returns
// ErrInjectedRollback while the key and step (kind "step", or "batch" for HandleBatch) has
// rollbacks left.
func (in *injector) after(kind string, d *inbox.Delivery) error {
	if in.max <= 0 {
		return nil
	}
	k := fmt.Sprintf("%s\x00%s\x00%d", d.Key, kind, d.Step)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.seen[k] >= in.max {
		return nil
	}
	in.seen[k]++
	in.n++
	return fmt.Errorf("%w (key %q, %s %d)", ErrInjectedRollback, d.Key, kind, d.Step)
}

func (in *injector) total() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.n
}

// wrap returns h with the rollbacks of in injected, implementing the same optional
// interfaces the inbox looks for (Preparer, BatchHandler, BatchPreparer) and no others.
// (A BatchHandler's StatementPreparer is not passed on: its statements then run unprepared,
// as they do until PrepareStatements has succeeded.)
func wrap(h inbox.Handler, in *injector) inbox.Handler {
	b := &base{h: h, in: in}
	p, isPrep := h.(inbox.Preparer)
	bh, isBatch := h.(inbox.BatchHandler)
	if !isBatch {
		if isPrep {
			return &withPrepare{base: b, p: p}
		}
		return b
	}
	bt := &batch{base: b, b: bh}
	bp, isBatchPrep := h.(inbox.BatchPreparer)
	switch {
	case isBatchPrep && isPrep:
		return &batchBothPrepare{batch: bt, p: p, bp: bp}
	case isBatchPrep:
		return &batchWithBatchPrepare{batch: bt, bp: bp}
	case isPrep:
		return &batchWithPrepare{batch: bt, p: p}
	}
	return bt
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
	if err := b.in.after("step", d); err != nil {
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

// HandleBatch rolls the whole batch back when one of its deliveries has a rollback left:
// the Batcher then runs each of them one at a time (where Handle rolls back too).
func (w *batch) HandleBatch(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	ps, err := w.b.HandleBatch(ctx, tx, ds)
	if err != nil {
		return ps, err
	}
	var injected error
	for _, d := range ds {
		if err := w.in.after("batch", d); err != nil && injected == nil {
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

type batchWithBatchPrepare struct {
	*batch
	bp inbox.BatchPreparer
}

func (w *batchWithBatchPrepare) PrepareDelivery(ctx context.Context, d *inbox.Delivery) error {
	return w.bp.PrepareDelivery(ctx, d)
}

type batchBothPrepare struct {
	*batch
	p  inbox.Preparer
	bp inbox.BatchPreparer
}

func (w *batchBothPrepare) Prepare(ctx context.Context, d *inbox.Delivery) error {
	return w.p.Prepare(ctx, d)
}

func (w *batchBothPrepare) PrepareDelivery(ctx context.Context, d *inbox.Delivery) error {
	return w.bp.PrepareDelivery(ctx, d)
}

var (
	_ inbox.Preparer      = (*withPrepare)(nil)
	_ inbox.BatchHandler  = (*batch)(nil)
	_ inbox.Preparer      = (*batchWithPrepare)(nil)
	_ inbox.BatchPreparer = (*batchWithBatchPrepare)(nil)
	_ inbox.Preparer      = (*batchBothPrepare)(nil)
	_ inbox.BatchPreparer = (*batchBothPrepare)(nil)
)

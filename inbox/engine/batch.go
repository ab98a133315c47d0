package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/chanx"
	"github.com/onceflow/onceflow/internal/groupcommit"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/internal/txdefer"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// BatchConfig configures a Batcher. The tags declare the stock router's inbox.batch_*
// settings with their key, default, range and help. Package internal/settings reads them.
// The inbox's Config.MaxInFlightCalls bounds the calls a Batcher's inbox.Preparer makes at
// once.
type BatchConfig struct {
	// MaxSize is the most deliveries in one transaction. See docs/BENCHMARKS.md, section
	// "inbox.batch_size 512".
	MaxSize int `key:"batch_size" default:"512" range:"1..10000" help:"group commit: deliveries per transaction (a BatchHandler's own multi-row path, else a plain handler's deliveries behind savepoints); 1 turns it off"`
	// Linger is how long a batch waits for more deliveries once it has its first. While
	// another batch is running, it waits for that one, up to another Linger, as
	// groupcommit.Collect does. Deliveries that arrive while batches are running wait
	// anyway, so under load batches fill without lingering. A negative Linger means no
	// lingering. The zero value stands for the default.
	Linger time.Duration `key:"batch_linger" default:"2ms" range:"0..1s" zero:"-1ns" help:"how long a batch waits for more deliveries after its first"`
	// Workers is how many batch transactions run at once. See docs/BENCHMARKS.md, section
	// "inbox.batch_workers 2". A batch takes a second worker only when it is full or has
	// waited two Lingers. So at moderate load one transaction at a time carries everything
	// that arrived meanwhile.
	Workers int `key:"batch_workers" default:"2" range:"1..64" help:"batch transactions running at once (a second only for a full batch or one that waited 2× batch_linger; never two with one key)"`
	// LockRetries is how often a batch rolled back by a deadlock is retried whole before
	// its deliveries fall back to the one-at-a-time path. It is 3 by default.
	LockRetries int
	// SelectAfterClaim reads the claimed rows back with a SELECT after the claim, instead
	// of the claim's own RETURNING clause. Servers without INSERT … RETURNING always take
	// this path. They are MySQL and MariaDB before 10.5. On MariaDB the SELECT costs a
	// statement and a lookup per row. Tests set it to cover both paths.
	SelectAfterClaim bool
}

// WithDefaults returns c with its zero settings set to their defaults, as NewBatcher uses
// it. The stock router's inbox.batch_* defaults are these values.
func (c BatchConfig) WithDefaults() BatchConfig {
	c.setDefaults()
	return c
}

func (c *BatchConfig) setDefaults() {
	settings.SetDefaults(c)
	if c.Linger < 0 {
		c.Linger = noLinger
	}
	if c.LockRetries == 0 {
		c.LockRetries = 3
	}
}

// noLinger is a Linger of none, the batch_linger tag's zero value.
const noLinger time.Duration = -1

// Validate reports the first invalid setting.
func (c BatchConfig) Validate() error {
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	if c.LockRetries < 0 {
		return fmt.Errorf("inbox: batch lock retries %d is negative", c.LockRetries)
	}
	return nil
}

// Batcher runs concurrent deliveries of one Inbox in shared transactions, by group
// commit. Deliveries that arrive together come from different partitions, or from one
// partition with a parallel subscriber. They are claimed, handled and marked done with a
// handful of multi-row statements and one commit. The guarantees are those of Process.
// Each delivery's inbox row, effects and events commit together or not at all. Process
// runs anything off the happy path one at a time, after the batch. That covers a poison
// or conflicting message, a delivery the handler left at Continue and a failed batch.
//
// Any inbox.Handler is group-committed. Its Handle runs once per delivery in the shared
// transaction. So a delivery that fails or panics is rolled back alone, and retried or
// quarantined alone. An inbox.BatchHandler's HandleBatch does a batch's work with its own
// multi-row statements instead. An inbox.Preparer's Prepare runs for each delivery before it
// joins a batch.
//
// One collector forms the batches and hands each to an idle worker, with up to Workers
// transactions at once. While every worker is busy, deliveries gather in the next batch.
// So at moderate load batches run one after another, each taking what arrived meanwhile.
// That makes one transaction rather than two half-size ones on two workers. Under load
// every worker is busy with a full batch. A delivery whose key is in a running batch waits
// for the next one. So two batches never contend for one key's rows, because concurrent
// multi-row claims of common keys deadlock on InnoDB's duplicate-check locks. Copies of a
// key within a batch are counted as duplicates in the same transaction.
type Batcher struct {
	ib     *Inbox
	bh     inbox.BatchHandler // nil for a plain handler, whose Handle runs for each delivery in the batch
	prep   inbox.Preparer     // the handler's Preparer, run by the gate, or nil
	gate   *prepareGate       // nil unless the handler is a Preparer
	cfg    BatchConfig
	queue  chan *pending // decoded deliveries, for the collector
	decode chan *pending // deliveries not yet decoded, for the decoders
	stop   chan struct{}
	closed chan struct{} // closed once the collector, every worker and decoder have returned
	wg     sync.WaitGroup
	once   sync.Once
	q      batchQueries

	// claimReturning and claimPlain are the claim as dbx.MultiRow statements of a few row
	// counts, with and without its RETURNING clause. The first batch decides which one
	// runs.
	claimReturning, claimPlain *dbx.MultiRow

	returning atomic.Int32 // 1 if the claim reads its rows back with RETURNING, -1 if it cannot, 0 if not yet known

	savepointsUntil atomic.Int64 // for plain handlers, the Unix ns until which batches set savepoints from the start

	mu    sync.Mutex
	stats BatchStats
}

// BatchStats counts what a Batcher did.
type BatchStats struct {
	Batches    int64 // committed batch transactions
	Batched    int64 // deliveries finished inside a batch, processed or duplicate
	Fallbacks  int64 // deliveries handed to the one-at-a-time path
	Rollbacks  int64 // batch transactions rolled back, then retried or fallen back
	MaxBatched int   // most deliveries seen in one batch
	Returning  bool  // the claim reads its rows back with RETURNING, on MariaDB 10.5 and later, not with a SELECT
	// Isolated counts, for plain handlers only, deliveries whose Handle failed, panicked,
	// timed out or returned an invalid Progress in a batch. Each was rolled back to its
	// savepoint, or taken out of the batch when the transaction could not go on. It was
	// then retried or quarantined alone.
	Isolated int64
	// InvalidProgress counts deliveries a HandleBatch left at an invalid Progress. They
	// fell back and were never taken for done.
	InvalidProgress int64

	// The Prepare counters count only for handlers with an inbox.Preparer.
	Preparing      int64 // deliveries being prepared now, with calls in flight
	Prepared       int64 // deliveries prepared
	PrepareFailed  int64 // prepares that failed, panicked or timed out
	PrepareSkipped int64 // deliveries not prepared, such as those whose key had just been finished
}

type pending struct {
	ctx      context.Context
	msg      *message.Message
	src      inbox.Source
	dec      decoded
	start    time.Time
	done     chan struct{} // signalled once out is set, a channel of a pointer-free type for one allocation
	then     func(error)   // Deliver's done: set instead of done, called by settle once out is set
	b        *Batcher      // with then, the Batcher that settles it
	out      batchOutcome
	gated    atomic.Bool // admitted by the prepare gate, so released once it has its outcome
	prepared any         // what Prepare left in Delivery.Prepared
	ready    bool        // Prepare succeeded, so the handler may run it in a batch
	span     trace.Span  // the delivery's span, nil without tracing
	ticket   *ticket     // the circuit breaker's admission of its attempt in a batch, nil without a breaker
	admitted ticket      // what ticket points to
	hold     *callHold   // the key's call lease, taken by the prepare gate, or nil
}

// carried is what p's Prepare made, for the one-at-a-time path's first step. It is nil
// when Prepare made nothing.
func (p *pending) carried() *carried {
	if !p.ready {
		return nil
	}
	return &carried{step: 0, value: p.prepared, ok: true}
}

// answer gives p its one outcome. The key's call lease ends first, so that the path
// answered can take it again. Ending it deletes its row, unless the batch's transaction
// did.
func (p *pending) answer(o batchOutcome) {
	if h := p.hold; h != nil {
		p.hold = nil
		h.End()
	}
	p.out = o
	if p.then != nil {
		p.b.settle(p)
		return
	}
	p.done <- struct{}{}
}

type batchOutcome struct {
	res      Result
	fallback bool
	failed   *failure // the delivery's failed attempt, to count, then retry or quarantine alone
	// uncertain reports that the batch committed some of a fallen-back delivery's work,
	// because it was left at Continue. Or the batch may have, because its commit got no
	// answer.
	uncertain bool
}

type batchQueries struct {
	claimHead, claimTail, returning, selectHead, dupHead, doneHead, reopenHead string
	failed                                                                     string
	d                                                                          dbx.Dialect
}

// claimGroup is one row of the batch claim, in insertColumns' order. A new row is written
// 'done' at its first attempt, with no reason, error or replay. Those are constants of the
// statement rather than parameters, which costs MariaDB less CPU per row. So are tombstone
// and payload_size, because a tombstone, a nil value, never takes the batch path.
const claimGroup = "(?, ?, 'done', NULL, ?, ?, ?, ?, ?, ?, ?, 1, NULL, NULL, ?, FALSE, NULL)"

// claimWidth is the number of parameters of one row of the claim, claimGroup.
const claimWidth = 10

// claimRows is the most rows one claim statement carries. A batch claims its rows with
// dbx.MultiRow, in prepared statements of claimRows, then of smaller powers of two down to
// 16 rows. The rest, fewer than 16, go interpolated in one statement. A prepared 64-row
// claim costs the server about as much per row as a 512-row one. See docs/BENCHMARKS.md,
// section "Prepared multi-row statements".
const claimRows = 256

func newBatchQueries(t string, d dbx.Dialect) batchQueries {
	i := strings.Index(insertColumns, "VALUES ")
	q := batchQueries{
		claimHead: fmt.Sprintf("INSERT INTO %s %s", t, insertColumns[:i+len("VALUES ")]),
		// On an existing row, the claim takes the exclusive row lock, as claim does, and
		// counts a duplicate.
		claimTail:  " ON DUPLICATE KEY UPDATE duplicates = duplicates + 1",
		returning:  " RETURNING id, dedup_key, status, fingerprint, reason, duplicates",
		selectHead: fmt.Sprintf("SELECT id, dedup_key, status, fingerprint, reason, duplicates FROM %s WHERE biz_type = ? AND dedup_key IN ", t),
		dupHead:    fmt.Sprintf("UPDATE %s SET duplicates = duplicates + ? WHERE id IN ", t),
		doneHead:   fmt.Sprintf("UPDATE %s SET status = 'done', attempts = GREATEST(attempts, 1), reason = NULL, last_error = NULL WHERE id IN ", t),
		reopenHead: fmt.Sprintf("UPDATE %s SET status = 'processing' WHERE id IN ", t),
		// failed counts a plain handler's failed attempt on its row in the batch. The row is
		// left to resume, and the statement's insert id is its count of attempts.
		failed: fmt.Sprintf("UPDATE %s SET status = 'processing', attempts = LAST_INSERT_ID(attempts + ?), last_error = ? WHERE id = ?", t),
	}
	if d.IsPostgres() {
		q.claimTail = fmt.Sprintf(" ON CONFLICT (dedup_key, biz_type) DO UPDATE SET duplicates = %s.duplicates + 1", t)
		q.failed = d.Rebind(fmt.Sprintf("UPDATE %s SET status = 'processing', attempts = attempts + ?, last_error = ? WHERE id = ? RETURNING attempts", t))
	}
	q.d = d
	return q
}

// in is head, a statement ending in "IN ", with a list of n placeholders, in the dialect.
func (q batchQueries) in(head string, n int) string { return q.d.Rebind(head + placeholders(n)) }

// NewBatcher returns a Batcher for ib. An inbox.BatchHandler's batches run its HandleBatch.
// Any other handler's batches run its Handle for each delivery. An inbox.Preparer's Prepare
// runs for each delivery before its batch, outside any transaction. NewBatcher starts the
// Batcher's collector and workers, and Close stops them.
func (ib *Inbox) NewBatcher(cfg BatchConfig) (*Batcher, error) {
	bh, _ := ib.h.(inbox.BatchHandler)
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Batcher{ib: ib, bh: bh, cfg: cfg,
		stop:   make(chan struct{}),
		closed: make(chan struct{}),
		q:      newBatchQueries(ib.cfg.Table, ib.d),
	}
	claimText := func(returning bool) func(n int) string {
		return func(n int) string {
			var q strings.Builder
			q.WriteString(b.q.claimHead)
			for i := range n {
				if i > 0 {
					q.WriteString(", ")
				}
				q.WriteString(claimGroup)
			}
			q.WriteString(b.q.claimTail)
			if returning {
				q.WriteString(b.q.returning)
			}
			return q.String()
		}
	}
	b.claimReturning = dbx.NewMultiRow(ib.db, claimWidth, claimRows, claimText(true))
	b.claimPlain = dbx.NewMultiRow(ib.db, claimWidth, claimRows, claimText(false))
	if prep, ok := ib.h.(inbox.Preparer); ok {
		b.prep = prep
		b.gate = newPrepareGate(b, prep.Prepare, ib.calls)
	}
	b.queue = make(chan *pending, cfg.MaxSize)
	b.wg.Go(b.collect)
	b.decode = make(chan *pending, cfg.MaxSize)
	for range decoders {
		b.wg.Go(b.decoder)
	}
	return b, nil
}

// decoders is how many goroutines decode the deliveries of a Batcher. Decoding runs on
// these long-lived goroutines rather than on the caller's. A router runs each message on a
// fresh goroutine, whose small stack would have to grow for the JSON decoder. Growing a
// stack copies it, and that can cost more than the decoding itself.
const decoders = 2

// decoder decodes deliveries and queues them for the collector. A payload that does not
// decode goes back to its caller, for the one-at-a-time path to quarantine.
func (b *Batcher) decoder() {
	for {
		var p *pending
		// Try a receive alone first, because a select over two channels locks both, and
		// every delivery passes here. The blocking select below picks one of the ready
		// cases, as the fast path does.
		select {
		case <-b.stop:
			return
		default:
		}
		select {
		case p = <-b.decode:
		default:
			select {
			case p = <-b.decode:
			case <-b.stop:
				return
			}
		}
		dec, err := b.ib.decode(p.msg)
		if err != nil || p.msg.Payload == nil {
			// The one-at-a-time path records poison and tombstones. The batch claim stores
			// no tombstone flag.
			p.answer(batchOutcome{fallback: true})
			continue
		}
		p.dec = dec
		if b.gate != nil {
			b.gate.admit(p)
			continue
		}
		if !chanx.TrySend(b.queue, p, b.stop) {
			select {
			case b.queue <- p:
			case <-b.stop:
				p.answer(batchOutcome{fallback: true})
			}
		}
	}
}

// Close stops the Batcher after the batches already running. Their callers run the
// deliveries still queued, one at a time.
func (b *Batcher) Close() error {
	b.once.Do(func() {
		close(b.stop)
		b.wg.Wait()
		_ = b.claimReturning.Close()
		_ = b.claimPlain.Close()
		close(b.closed)
		// Deliveries that Deliver queued for the decoders and no decoder took. Process's
		// callers see closed and run theirs themselves.
		drain(b.decode)
	})
	return nil
}

// Stats returns what the Batcher did so far.
func (b *Batcher) Stats() BatchStats {
	b.mu.Lock()
	st := b.stats
	b.mu.Unlock()
	st.Returning = b.returning.Load() == 1
	if g := b.gate; g != nil {
		st.Preparing, st.Prepared, st.PrepareFailed, st.PrepareSkipped = g.running.Load(), g.prepared.Load(), g.failed.Load(), g.skipped.Load()
	}
	return st
}

// ObservePrepares makes the Batcher report each Prepare call's duration and error to fn,
// such as for metrics. Call it before the first delivery.
func (b *Batcher) ObservePrepares(fn func(elapsed time.Duration, err error)) {
	if b.gate != nil {
		b.gate.observe = fn
	}
}

// HandlerFunc adapts the Batcher to a Watermill router handler for messages consumed from
// topic, like Inbox.HandlerFunc. The router runs one handler goroutine per message, so
// concurrent messages meet in the Batcher.
func (b *Batcher) HandlerFunc(topic string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		res, err := b.Process(msg.Context(), msg, SourceOf(msg, topic))
		if err == nil {
			err = b.ib.awaitDelayed(msg.Context(), res)
		}
		return err
	}
}

// Process runs one live delivery, in a shared transaction when it can. It returns what
// Inbox.Process would, once the outcome is committed. When ctx ends while the delivery's
// batch runs, it returns at once with an error wrapping ErrOutcomeUnknown, because the
// batch may still commit the delivery.
func (b *Batcher) Process(ctx context.Context, msg *message.Message, src inbox.Source) (Result, error) {
	return b.processWaiting(ctx, msg, src, 0)
}

// processWaiting is Process waiting up to wait, once ctx has ended, for the outcome of a
// batch the delivery is in. RunCommand uses it.
func (b *Batcher) processWaiting(ctx context.Context, msg *message.Message, src inbox.Source, wait time.Duration) (Result, error) {
	if b.ib.tr != nil {
		return b.processTraced(ctx, msg, src, wait)
	}
	return b.process(ctx, msg, src, nil, wait)
}

// process is processWaiting. span is the delivery's, or nil without tracing.
func (b *Batcher) process(ctx context.Context, msg *message.Message, src inbox.Source, span trace.Span, wait time.Duration) (Result, error) {
	// An open breaker holds the delivery back before it joins a batch, and no attempt is
	// spent.
	p := &pending{ctx: ctx, msg: msg, src: src, done: make(chan struct{}, 1), span: span}
	if br := b.ib.br; br != nil {
		if err := br.admitTo(ctx, &p.admitted); err != nil {
			return Result{}, fmt.Errorf("inbox %s: waiting on the circuit breaker: %w", b.ib.cfg.BizType, err)
		}
		p.ticket = &p.admitted
	}
	t := p.ticket
	defer t.done(verdictNone) // when no outcome said more
	p.start = time.Now()
	if !chanx.TrySend(b.decode, p, b.stop) {
		select {
		case b.decode <- p:
		case <-b.stop:
			t.done(verdictNone) // Process asks the breaker itself
			return b.ib.run(ctx, msg, src, b.ib.liveOptions())
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	select {
	case <-p.done:
		o := p.out
		return b.outcome(ctx, p, o)
	case <-b.closed:
		// The collector, workers and decoders have returned. The delivery was answered, or
		// never taken.
		select {
		case <-p.done:
			o := p.out
			return b.outcome(ctx, p, o)
		default:
			t.done(verdictNone)
			res, err := b.ib.run(ctx, msg, src, b.ib.liveOptions())
			b.release(p, res, err)
			return res, err
		}
	case <-ctx.Done():
		// The batch may still commit this delivery, so wait up to wait for its outcome. A
		// fallback then fails at once on the ended ctx, and only then is nothing committed.
		if o, ok := b.await(p, wait); ok {
			return b.outcome(ctx, p, o)
		}
		// The batch is still running. An error means "not acked". A redelivery, or a retry
		// with the token, finds the row done and counts a duplicate. The key stays taken
		// until then.
		if b.gate != nil { // it may be admitted, and take its key, after this returns
			go func() {
				select {
				case <-p.done:
					o := p.out
					b.release(p, o.res, nil)
				case <-b.closed:
					b.release(p, Result{}, ctx.Err())
				}
			}()
		}
		return Result{}, outcomeUnknown(ctx.Err())
	}
}

// await waits up to wait for p's outcome.
func (b *Batcher) await(p *pending, wait time.Duration) (batchOutcome, bool) {
	if wait <= 0 {
		return batchOutcome{}, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.done:
		o := p.out
		return o, true
	case <-b.closed:
		select {
		case <-p.done:
			o := p.out
			return o, true
		default:
			return batchOutcome{fallback: true}, true // never taken
		}
	case <-t.C:
		return batchOutcome{}, false
	}
}

func (b *Batcher) outcome(ctx context.Context, p *pending, o batchOutcome) (Result, error) {
	res, err := o.res, error(nil)
	switch {
	case o.failed != nil:
		p.ticket.failed(attemptVerdict(ctx, o.failed.err), o.failed.err) // before Process's own attempts ask the breaker
		res, err = b.afterFailure(ctx, p, o.failed)
	case o.fallback:
		p.ticket.done(verdictNone)
		opts := b.ib.liveOptions()
		if !o.uncertain {
			opts.carry = p.carried() // nothing of the key committed: its calls stand
		}
		res, err = b.ib.run(ctx, p.msg, p.src, opts)
		if err != nil && o.uncertain {
			err = outcomeUnknown(err)
		}
	}
	if o.failed == nil && !o.fallback && res.Outcome == OutcomeProcessed {
		p.ticket.done(verdictSuccess)
	}
	b.release(p, res, err)
	return res, err
}

// release lets the next delivery of p's key be prepared once p has its final outcome.
func (b *Batcher) release(p *pending, res Result, err error) {
	if !p.gated.CompareAndSwap(true, false) {
		return
	}
	done := err == nil && (res.Outcome == OutcomeProcessed || res.Outcome == OutcomeDuplicate)
	b.gate.release(p, done)
}

// collect forms batches of the queued deliveries and runs them with groupcommit.Collect.
// A batch goes to an idle worker once Linger has passed or it is full. A delivery whose
// key is in a running batch waits for a later one. On stop, deliveries taken but not run,
// and those still queued, go back to their callers.
func (b *Batcher) collect() {
	cfg := groupcommit.Config{MaxSize: b.cfg.MaxSize, Linger: b.cfg.Linger, Workers: b.cfg.Workers}
	left := groupcommit.Collect(cfg, b.queue, b.stop, func(p *pending) string { return p.dec.Key }, b.run)
	fallBack(left)
	drain(b.queue)
}

func drain(in chan *pending) {
	for {
		select {
		case p := <-in:
			p.answer(batchOutcome{fallback: true})
		default:
			return
		}
	}
}

func fallBack(ps []*pending) {
	for _, p := range ps {
		p.answer(batchOutcome{fallback: true})
	}
}

// fallBackUncertain hands ps to the one-at-a-time path, after their batch committed some
// of their work, or may have. See batchOutcome.uncertain.
func fallBackUncertain(ps []*pending) {
	for _, p := range ps {
		p.answer(batchOutcome{fallback: true, uncertain: true})
	}
}

// item is one business key of a batch. It holds the key's first delivery, and later
// copies with the same payload, which are duplicates within the batch.
type item struct {
	p       *pending
	copies  []*pending
	d       *inbox.Delivery
	id      int64
	resumed bool     // the row was 'processing' before this batch
	ran     bool     // the handler ran on it in this batch (a step of it may have committed with the batch)
	res     *Result  // set when finished in the batch
	failed  *failure // a plain handler's Handle failed in the batch, rolled back to its savepoint (grouped.go)

	// d and res point here, so a batch allocates its items, deliveries and results at once.
	delivery inbox.Delivery
	result   Result
}

// finish sets the item's result.
func (it *item) finish(r Result) {
	it.result = r
	it.res = &it.result
}

// run handles one batch. Every pending delivery gets exactly one outcome.
func (b *Batcher) run(batch []*pending) {
	ib := b.ib
	items := make([]*item, 0, len(batch))
	slots := make([]item, len(batch))
	var rest []*pending // one at a time: conflicting payloads within the batch, cancelled ones
	byKey := make(map[string]*item, len(batch))
	for _, p := range batch {
		if p.ctx.Err() != nil {
			rest = append(rest, p)
			continue
		}
		if it := byKey[p.dec.Key]; it != nil {
			if it.p.dec.Fingerprint == p.dec.Fingerprint {
				it.copies = append(it.copies, p)
			} else {
				rest = append(rest, p)
			}
			continue
		}
		it := &slots[len(items)]
		it.p = p
		it.delivery = inbox.Delivery{Message: p.msg, BizType: ib.cfg.BizType, Key: p.dec.Key, Value: p.dec.Value, Source: p.src, Attempt: 1, Prepared: p.prepared}
		it.d = &it.delivery
		byKey[p.dec.Key] = it
		items = append(items, it)
	}
	fallBack(rest)
	if len(items) == 0 {
		return
	}
	// One lock order for every batch and for the handler's own rows, keyed alike.
	sort.Slice(items, func(i, j int) bool { return items[i].p.dec.Key < items[j].p.dec.Key })
	ctx, span := b.startBatch(context.WithoutCancel(items[0].p.ctx), items)
	b.prepareClaim(ctx)
	var err error
	// The batch's span, if the inbox traces, ends with the batch's final outcome.
	defer func() { tracex.End(span, err) }()
	var blamed []*blamedError // for plain handlers, deliveries taken out of the batch
	defer func() { b.answerBlamed(blamed) }()
	for try := 0; ; try++ {
		for _, it := range items {
			it.res, it.id, it.resumed, it.d.Resumed, it.failed, it.ran = nil, 0, false, false, nil, false
			// A retried batch starts its deliveries afresh, because Handle may consume
			// Prepared.
			it.d.Step, it.d.Prepared = 0, it.p.prepared
		}
		tctx, cancel := context.WithTimeout(withDialect(ctx, ib.d), ib.cfg.HandlerTimeout)
		sp := len(blamed) > 0 || b.savepointsFirst() // a plain handler's deliveries behind savepoints
		// committed holds what the batch's writes want done once it committed, such as an
		// outbox.Writer handing its events to the relay of this process. There is none
		// behind savepoints, as a delivery rolled back to its savepoint would leave its part
		// behind.
		var committed *txdefer.Commit
		body, endCommit := ib.committing(tctx, func(tx *sql.Tx) error {
			rctx := tctx
			committed = nil
			if !sp {
				committed = txdefer.NewCommit(ib.db, tx)
				rctx = txdefer.WithCommit(tctx, committed)
			}
			return b.runTx(rctx, tx, items, sp)
		})
		err = dbx.InTx(tctx, ib.db, body)
		endCommit(err)
		cancel()
		if err == nil {
			if committed != nil {
				committed.Committed()
			}
			for _, it := range items {
				it.p.hold.Deleted() // runTx deleted the call leases of the batch
			}
			break
		}
		if bl, ok := errors.AsType[*blamedError](err); ok {
			// One delivery's Handle left the transaction unusable. It timed out, or its
			// savepoint could not be restored. It is retried or quarantined alone. The
			// others run once more without it, in a new transaction. Should that fail the
			// same way, they fall back too.
			b.count(func(s *BatchStats) { s.Rollbacks++ })
			b.failedInBatch()
			blamed = append(blamed, bl)
			items = slices.DeleteFunc(items, func(it *item) bool { return it == bl.it })
			if len(blamed) == 1 && len(items) > 0 {
				continue
			}
			if len(items) == 0 {
				return
			}
			break
		}
		if r := failureReason(err); r == ReasonPanic || r == ReasonTimeout {
			break // a panic or a timeout in HandleBatch: its Deliveries are abandoned
		}
		b.count(func(s *BatchStats) { s.Rollbacks++ })
		if !dbx.IsLockConflict(err) || try >= b.cfg.LockRetries {
			break
		}
		sleep(ctx, time.Duration(1+rand.IntN(10))*time.Millisecond)
	}
	if err != nil {
		b.fallBackItems(items, rest, "batch rolled back", err)
		return
	}
	var batched, fell, isolated int64
	for _, it := range items {
		if it.failed != nil {
			isolated++
			fell += int64(len(it.copies))
			fallBack(it.copies)
			it.p.answer(batchOutcome{failed: it.failed})
			continue
		}
		if it.res == nil {
			fell += int64(1 + len(it.copies))
			if it.ran {
				fallBackUncertain(append(it.copies, it.p)) // left at Continue: its first steps committed
			} else {
				fallBack(append(it.copies, it.p))
			}
			continue
		}
		res := *it.res
		res.Attempts = 1
		ib.obs.Delivered(ib.cfg.BizType, res, time.Since(it.p.start))
		it.p.answer(batchOutcome{res: res})
		dup := Result{Outcome: OutcomeDuplicate, InboxID: res.InboxID, Key: res.Key, Reason: res.Reason, Attempts: 1}
		if res.Outcome == OutcomeHeld {
			dup.Outcome = OutcomeHeld // copies of a held key are held with it
		}
		for _, c := range it.copies {
			ib.obs.Delivered(ib.cfg.BizType, dup, time.Since(c.start))
			c.answer(batchOutcome{res: dup})
		}
		batched += int64(1 + len(it.copies))
	}
	if isolated > 0 {
		b.failedInBatch()
	}
	b.count(func(s *BatchStats) {
		s.Batches++
		s.Batched += batched
		s.Fallbacks += fell + int64(len(rest))
		s.Isolated += isolated
		s.MaxBatched = max(s.MaxBatched, len(batch))
	})
}

// fallBackItems hands every delivery of a batch that did not commit to the one-at-a-time
// path.
func (b *Batcher) fallBackItems(items []*item, rest []*pending, why string, err error) {
	b.ib.logger.Info(why+", its deliveries run one at a time", watermill.LogFields{"size": len(items), "err": validText(err.Error(), 1000)})
	var n int64
	for _, it := range items {
		if errors.Is(err, dbx.ErrCommitUnknown) {
			fallBackUncertain(append(it.copies, it.p))
		} else {
			fallBack(append(it.copies, it.p))
		}
		n += int64(1 + len(it.copies))
	}
	b.count(func(s *BatchStats) { s.Fallbacks += n + int64(len(rest)) })
}

func (b *Batcher) count(f func(*BatchStats)) {
	b.mu.Lock()
	f(&b.stats)
	b.mu.Unlock()
}

// runTx claims every item's inbox row, counts duplicates, runs the handler on the rest and
// records what it finished. It runs a fixed number of statements, whatever the batch size.
//
// The claim inserts new rows already 'done', so the common case needs no second write per
// row. Nothing outside this transaction sees the rows before it commits. A delivery the
// handler does not finish is set back to 'processing' here, on a rare path. On an existing
// row, the claim's update counts the delivery as a duplicate and takes the row lock. That
// counter tells a new row from an existing one, because it is 0 only on a row this
// statement inserted.
func (b *Batcher) runTx(ctx context.Context, tx *sql.Tx, items []*item, savepoints bool) error {
	ib := b.ib
	// 1. The claim inserts the missing rows, and locks the existing ones and counts a
	// duplicate on each.
	args := make([]any, 0, len(items)*claimWidth)
	// Arguments every row shares are boxed once, because an interface of a string or a
	// time is an allocation. So are a topic and metadata the rows repeat.
	bizType, expire := any(ib.cfg.BizType), any(time.Now().Add(ib.cfg.Retention).UTC())
	var topic, meta boxedString
	byKey := make(map[string]*item, len(items))
	for _, it := range items {
		args = append(args, it.p.dec.Key, bizType, messageUUID(it.p.msg), topic.of(it.p.src.Topic), it.p.src.Partition, it.p.src.Offset,
			[]byte(it.p.msg.Payload), meta.of(it.p.dec.meta), it.p.dec.Fingerprint, expire)
		byKey[it.p.dec.Key] = it
	}
	counts := map[int][]any{} // duplicate counter corrections → inbox ids
	var run []*item
	// One set of scan targets serves every row. The text columns are read in place, with
	// no string per row. Only a fingerprint that differs from the delivery's is copied out.
	var (
		r                   inboxRow
		key, status, stored sql.RawBytes
		dups                int
	)
	scan := func(rows *sql.Rows) error {
		r = inboxRow{}
		if err := rows.Scan(&r.id, &key, &status, &stored, &r.reason, &dups); err != nil {
			return fmt.Errorf("read claimed inbox rows: %w", err)
		}
		it := byKey[string(key)]
		if it == nil {
			return nil
		}
		r.status = statusOf(status)
		r.fingerprint = storedFingerprintOf(stored, it.p.dec.Fingerprint)
		it.id, it.d.InboxID = r.id, r.id
		switch decideClaim(dups == 0, r, it.p.dec.Fingerprint, true, false) {
		case claimRun:
			run = append(run, it)
		case claimConflict:
			// Left to Process, which quarantines it.
			counts[-1] = append(counts[-1], r.id)
		case claimDuplicate:
			if len(it.copies) > 0 {
				counts[len(it.copies)] = append(counts[len(it.copies)], r.id)
			}
			res := Result{Outcome: OutcomeDuplicate, InboxID: r.id, Key: it.p.dec.Key}
			if r.status == StatusFailed {
				res.Outcome, res.Reason = OutcomeHeld, Reason(r.reason.String)
			}
			it.finish(res)
		case claimResume:
			// A 'processing' row is an earlier delivery's unfinished work, resumed here.
			counts[-1] = append(counts[-1], r.id)
			it.resumed, it.d.Resumed = true, true
			run = append(run, it)
		}
		return nil
	}
	// 2. Read the claimed rows back. The claim's RETURNING clause returns each row as the
	// claim left it. Without it, a plain SELECT reads them. The claim locked them all, so a
	// plain read sees their current state, and a locking read here would only add
	// deadlocks.
	if err := b.claimRows(ctx, tx, items, args, scan); err != nil {
		return err
	}
	if len(run) > 0 {
		if err := b.handle(ctx, tx, run, counts, savepoints); err != nil {
			return err
		}
		if err := b.saveReplies(ctx, tx, run); err != nil {
			return err
		}
	}
	for n, ids := range counts {
		if _, err := tx.ExecContext(ctx, b.q.in(b.q.dupHead, len(ids)), append([]any{n}, ids...)...); err != nil {
			return fmt.Errorf("count duplicates of %d rows: %w", len(ids), err)
		}
	}
	// The keys' call leases end with the batch. A path that takes one after the commit
	// finds the row as the batch left it.
	var holds []*callHold
	for _, it := range items {
		if it.p.hold != nil {
			holds = append(holds, it.p.hold)
		}
	}
	return ib.leases.releaseBatch(ctx, tx, holds)
}

// boxedString boxes a string once for as long as the same string repeats.
type boxedString struct {
	s string
	v any
}

func (b *boxedString) of(s string) any {
	if b.v == nil || s != b.s {
		b.s, b.v = s, s
	}
	return b.v
}

// claimRows runs the batch's claim for runTx and reads the claimed rows back, calling scan
// for each. It runs under the "inbox claim" span when the inbox traces.
func (b *Batcher) claimRows(ctx context.Context, tx *sql.Tx, items []*item, args []any, scan func(*sql.Rows) error) (err error) {
	ib := b.ib
	if ib.tr != nil {
		var span trace.Span
		ctx, span = ib.startSpan(ctx, "inbox claim")
		defer func() { tracex.End(span, err) }()
	}
	if b.useReturning(ctx, tx) {
		if err := b.claimReturning.Query(ctx, tx, args, scan); err != nil {
			return fmt.Errorf("claim %d inbox rows: %w", len(items), err)
		}
	} else {
		if _, err := b.claimPlain.Exec(ctx, tx, args); err != nil {
			return fmt.Errorf("claim %d inbox rows: %w", len(items), err)
		}
		keyArgs := make([]any, 0, len(items)+1)
		keyArgs = append(keyArgs, ib.cfg.BizType)
		for _, it := range items {
			keyArgs = append(keyArgs, it.p.dec.Key)
		}
		rows, err := tx.QueryContext(ctx, b.q.in(b.q.selectHead, len(items)), keyArgs...)
		if err != nil {
			return fmt.Errorf("read claimed inbox rows: %w", err)
		}
		for rows.Next() {
			if err := scan(rows); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read claimed inbox rows: %w", err)
		}
	}
	return nil
}

// prepareClaim prepares the claim statements once the first batch has told which kind
// runs. Until then, and should preparing fail, claims run interpolated. It runs outside
// the batch's transaction, because preparing may need a pooled connection of its own.
func (b *Batcher) prepareClaim(ctx context.Context) {
	var m *dbx.MultiRow
	switch b.returning.Load() {
	case 1:
		m = b.claimReturning
	case -1:
		m = b.claimPlain
	default:
		return
	}
	if err := m.Prepare(ctx); err != nil {
		b.ib.logger.Error("inbox batch: claims run unprepared (slower); retrying in a minute", err, nil)
	}
}

// useReturning reports whether the claim can read its rows back itself. INSERT … ON
// DUPLICATE KEY UPDATE … RETURNING exists on MariaDB from 10.5, and not on MySQL. The
// first batch asks on its connection. If that fails, the next batch asks again. Two first
// batches may both ask.
func (b *Batcher) useReturning(ctx context.Context, tx *sql.Tx) bool {
	if r := b.returning.Load(); r != 0 {
		return r == 1
	}
	r := int32(-1)
	switch d := b.ib.d; {
	case b.cfg.SelectAfterClaim || !d.Returning():
	case d.IsPostgres():
		r = 1
	default:
		var v string
		if err := tx.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
			return false // the SELECT path works everywhere
		}
		if returningSupported(v) {
			r = 1
		}
		b.ib.logger.Info("batch claims read their rows back", watermill.LogFields{"server": v, "returning": r == 1})
	}
	b.returning.Store(r)
	return r == 1
}

// returningSupported reports whether a server of this VERSION() has INSERT … RETURNING.
func returningSupported(version string) bool {
	if !strings.Contains(version, "MariaDB") {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 10 || major == 10 && minor >= 5
}

// handle runs the handler on the rows that are ours to run, sorted by key. It brings the
// rows' status in line with what the handler finished, and counts the copies of a finished
// delivery.
func (b *Batcher) handle(ctx context.Context, tx *sql.Tx, run []*item, counts map[int][]any, savepoints bool) error {
	if b.bh == nil {
		return b.handleGrouped(ctx, tx, run, counts, savepoints)
	}
	ib := b.ib
	var done, unfinished []any // resumed rows now done, and new rows the handler did not finish
	ready := make([]*item, 0, len(run))
	for _, it := range run {
		if b.prep != nil && !it.p.ready {
			// The delivery was not prepared and its calls are not made, so it is not
			// handled here.
			if !it.resumed {
				unfinished = append(unfinished, it.id)
			}
			continue
		}
		it.ran = true
		ready = append(ready, it)
	}
	if len(ready) == 0 {
		return b.markRows(ctx, tx, done, unfinished)
	}
	run = ready
	ds := make([]*inbox.Delivery, len(run))
	for i, it := range run {
		ds[i] = it.d
	}
	var progs []inbox.Progress
	hctx, span := ib.startSpan(ctx, "inbox handle")
	err := guard(hctx, "handle batch", func() error {
		var err error
		progs, err = b.bh.HandleBatch(hctx, tx, ds)
		return err
	})
	tracex.End(span, err)
	if err != nil {
		return err
	}
	if len(progs) != len(ds) {
		return fmt.Errorf("inbox %s: HandleBatch returned %d results for %d deliveries", ib.cfg.BizType, len(progs), len(ds))
	}
	invalid := 0
	for i, it := range run {
		if progs[i] != inbox.Done {
			// Continue, or a slot the handler left at the zero or another invalid Progress,
			// is never done. The one-at-a-time path finds out what is left.
			if !validProgress(progs[i]) {
				invalid++
			}
			if !it.resumed {
				unfinished = append(unfinished, it.id)
			}
			continue
		}
		if it.resumed {
			done = append(done, it.id)
		}
		it.finish(Result{Outcome: OutcomeProcessed, InboxID: it.id, Key: it.p.dec.Key})
		if len(it.copies) > 0 {
			counts[len(it.copies)] = append(counts[len(it.copies)], it.id)
		}
	}
	if invalid > 0 {
		ib.logger.Error("HandleBatch left deliveries at an invalid Progress (neither Done nor Continue); they run one at a time",
			fmt.Errorf("%w: %d of %d", inbox.ErrInvalidProgress, invalid, len(progs)), nil)
		b.count(func(s *BatchStats) { s.InvalidProgress += int64(invalid) })
	}
	return b.markRows(ctx, tx, done, unfinished)
}

// markRows marks the resumed rows in done 'done'. It sets the new rows in unfinished back
// to 'processing', because the claim inserted them 'done'.
func (b *Batcher) markRows(ctx context.Context, tx *sql.Tx, done, unfinished []any) error {
	if len(done) > 0 {
		if _, err := tx.ExecContext(ctx, b.q.in(b.q.doneHead, len(done)), done...); err != nil {
			return fmt.Errorf("mark %d inbox rows done: %w", len(done), err)
		}
	}
	if len(unfinished) > 0 {
		if _, err := tx.ExecContext(ctx, b.q.in(b.q.reopenHead, len(unfinished)), unfinished...); err != nil {
			return fmt.Errorf("reopen %d inbox rows: %w", len(unfinished), err)
		}
	}
	return nil
}

// placeholders returns "(?, ?, ..., ?)" with n marks.
func placeholders(n int) string {
	if n <= 0 {
		panic(errors.New("inbox: placeholders for an empty list"))
	}
	return "(?" + strings.Repeat(", ?", n-1) + ")"
}

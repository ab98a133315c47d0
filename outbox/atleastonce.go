package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// atLeastOnce is the engine of NewRelay.
//
// The relay claims rows with FOR UPDATE SKIP LOCKED at READ COMMITTED, which takes row
// locks only. So business inserts never wait for the relay, and two relays never publish
// the same row at the same time.
//
// A locking scan is not a snapshot, and that matters for the order per key. A scan of the
// pending rows with SKIP LOCKED skips a row whose transaction is still committing. It then
// picks up rows of transactions that committed a moment later. So a key's later event could
// overtake an earlier one. The relay therefore first reads the pending ids with a plain
// consistent read, which sees only committed rows. It then locks exactly those rows with
// SKIP LOCKED. Another relay may hold a candidate, so that the relay cannot lock it. That
// candidate holds back every later candidate of the same key until the next poll.
//
// The producer is idempotent and waits for all acks, so broker retries add no duplicates.
// A relay may crash after Kafka accepted a batch but before the rows were marked. It then
// publishes that batch again on restart, with the same event_id header. So delivery is at
// least once.
type atLeastOnce struct {
	*relayBase
	producer Producer
	claimQ   struct{ pending, prefix, suffix string }

	md       Metadata // CheckWith
	maxBytes int

	isoMu sync.Mutex
	iso   isolation
}

var _ relayEngine = (*atLeastOnce)(nil)

// NewRelay builds a Relay that publishes at least once. NewExactlyOnceRelay builds the
// exactly-once one.
func NewRelay(db *sql.DB, producer Producer, cfg RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	if db == nil || producer == nil {
		return nil, errors.New("relay: db and producer are required")
	}
	if cfg.Shards > 1 {
		return nil, errors.New("relay: several shards need the exactly-once relay (relay.exactly_once)")
	}
	b, err := newRelayBase(db, cfg, logger)
	if err != nil {
		return nil, err
	}
	a := &atLeastOnce{relayBase: b, producer: producer}
	t := b.cfg.Table
	a.claimQ.pending = fmt.Sprintf(`SELECT id, msg_key FROM %s WHERE published_at IS NULL %s LIMIT %d`, t, b.dl.pendingOrder(), b.cfg.BatchSize)
	a.claimQ.prefix = fmt.Sprintf(`SELECT id, event_id, event_type, topic, msg_key, payload, headers, trace_parent FROM %s
 WHERE published_at IS NULL AND `, t)
	a.claimQ.suffix = ` ORDER BY id FOR UPDATE SKIP LOCKED`
	return &Relay{relayBase: b, engine: a}, nil
}

// checkServer checks the pool's isolation. The at-least-once relay derives nothing.
func (r *atLeastOnce) checkServer(ctx context.Context) error {
	return r.relayBase.checkServer(ctx, nil)
}

func (r *atLeastOnce) run(ctx context.Context) { r.loop(ctx, "", atLeastOnceBatches{r}) }

// atLeastOnceBatches are the batches of the at-least-once relay. Its loop polls every
// PollInterval when idle. It has no lease, so it always cleans and can always be woken.
type atLeastOnceBatches struct{ r *atLeastOnce }

func (b atLeastOnceBatches) batch(ctx context.Context) (int, error) { return b.r.relayOnce(ctx) }
func (b atLeastOnceBatches) idleWait() time.Duration                { return b.r.cfg.PollInterval }
func (b atLeastOnceBatches) cleans() bool                           { return true }
func (b atLeastOnceBatches) wakeable() bool                         { return true }
func (b atLeastOnceBatches) idleMax() time.Duration                 { return b.r.cfg.IdlePollMax }

func (r *atLeastOnce) close() error { return nil }

func (r *atLeastOnce) checkWith(md Metadata, maxMessageBytes int) {
	r.md, r.maxBytes = md, maxMessageBytes
}

func (r *atLeastOnce) exactlyOnce() bool       { return false }
func (r *atLeastOnce) transactionalID() string { return "" }
func (r *atLeastOnce) owner() bool             { return true } // no lease: it always publishes
func (r *atLeastOnce) ownedShards() []int      { return nil }
func (r *atLeastOnce) fenced() bool            { return false }
func (r *atLeastOnce) stats() eosStats         { return eosStats{} }

// relayOnce publishes one batch in the claim's transaction. It marks published what Kafka
// acked and parks what Kafka refused for good. See Relay.RelayOnce.
func (r *atLeastOnce) relayOnce(ctx context.Context) (int, error) {
	if err := r.checkServer(ctx); err != nil {
		return 0, err
	}
	var (
		n       int
		sendErr error
		parked  []parkEntry
	)
	err := dbx.InTx(ctx, r.db, func(tx *sql.Tx) error {
		n, sendErr, parked = 0, nil, nil
		send, moved, err := r.claim(ctx, tx)
		parked = moved
		if err != nil || len(send) == 0 {
			return err
		}
		r.isoMu.Lock()
		batch := r.iso.cut(send)
		r.isoMu.Unlock()
		msgs := make([]*sarama.ProducerMessage, len(batch))
		for i, o := range batch {
			msgs[i] = o.msg
		}
		spans := r.startPublish(ctx, batch, "")
		err = r.producer.SendMessages(msgs)
		endPublish(spans, err) // none unless the relay traces
		if err != nil {
			var moved []parkEntry
			n, moved, sendErr, err = r.sentInPart(ctx, tx, batch, err)
			parked = append(parked, moved...)
			return err
		}
		r.hook("after-kafka-commit") // Kafka has acked, and the rows are not marked yet
		ids := make([]int64, len(batch))
		for i, o := range batch {
			ids[i] = o.id
		}
		if err := r.mark(ctx, tx, ids); err != nil {
			return err
		}
		r.isoMu.Lock()
		r.iso.outcome(batch, nil)
		r.isoMu.Unlock()
		n = len(ids)
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.logParked(parked, "")
	if n > 0 {
		r.batches.Add(1)
	}
	r.published.Add(int64(n))
	return n, sendErr
}

// sentInPart settles a batch whose send failed for some rows. It runs in the claim's
// transaction of the at-least-once mode. It marks the acked rows. It parks the rows Kafka
// refused for good, and holds the later rows of their keys behind them, acked or not. The
// other failed rows stay pending. So do the later rows of their keys, acked or not, so that
// those go out again after them. sentInPart returns how many rows it marked. When rows
// failed for another reason than a refusal, it also returns the batch's error.
func (r *atLeastOnce) sentInPart(ctx context.Context, tx *sql.Tx, batch []outRow, err error) (marked int, parked []parkEntry, batchErr, txErr error) {
	res := sortSend(batch, nil, err)
	if len(res.unknown) > 0 && r.md != nil {
		_ = r.md.RefreshMetadata(res.unknown...) // the next batch's check sees the topic as it is now
	}
	r.isoMu.Lock()
	guilty := r.iso.outcome(batch, res.refused)
	suspects := len(r.iso.suspects)
	r.isoMu.Unlock()
	isGuilty := make(map[int]bool, len(guilty))
	for _, i := range guilty {
		isGuilty[i] = true
	}
	var (
		entries []parkEntry
		acked   []int64
		heads   map[string]string
		failed  map[string]bool // keys with a row that failed and stays pending
	)
	for i, o := range batch {
		if isGuilty[i] {
			entries = append(entries, parkEntry{row: o, reason: res.reasons[i], err: refusal{res.reasons[i], res.errs[i]}.text(o)})
			if heads == nil {
				heads = map[string]string{}
			}
			if _, ok := heads[o.key]; !ok {
				heads[o.key] = o.eventID
			}
			continue
		}
		if head, ok := heads[o.key]; ok {
			entries = append(entries, parkEntry{row: o, reason: ReasonHeld, behind: head})
			continue
		}
		if _, ok := res.errs[i]; ok || failed[o.key] {
			// The row failed and is retried, or it was acked after a failed row of its key.
			// It stays pending, so it goes out again after that row. Delivery stays at
			// least once, in key order.
			if failed == nil {
				failed = map[string]bool{}
			}
			failed[o.key] = true
			continue
		}
		acked = append(acked, o.id)
	}
	moved, _, perr := r.park(ctx, tx, entries)
	if perr != nil {
		return 0, nil, nil, perr
	}
	if len(acked) > 0 {
		if err := r.mark(ctx, tx, acked); err != nil {
			return 0, nil, nil, err
		}
	}
	if len(res.refused) > len(guilty) {
		r.logger.Error("outbox relay: Kafka refused events of a batch and did not say which; sending them in smaller batches to find out",
			err, watermill.LogFields{"refused": len(res.refused), "suspects": suspects, "first": res.firstFail})
	}
	if res.failed > 0 {
		return len(acked), moved, fmt.Errorf("publish %d events: %d failed (retried), first %s", len(batch), res.failed, res.firstFail), nil
	}
	return len(acked), moved, nil, nil
}

// claim returns the next batch in id order. See atLeastOnce for why the pending ids are
// read first and locked second.
//
// claim reads the keys with parked events before and after the pending ids. The second
// read sees a key parked after the pending read. Its rows are held behind its parked event
// and move to the parked table in this transaction. So a park committed between the reads
// is never missed. A key parked before and not after was retried or dropped meanwhile. The
// pending read may have missed the events put back, so its rows wait for the next batch.
// claim also parks the rows Kafka would refuse by CheckWith's check, before anything is
// sent.
func (r *atLeastOnce) claim(ctx context.Context, tx *sql.Tx) (send []outRow, parked []parkEntry, err error) {
	type candidate struct {
		id  int64
		key string
	}
	before, err := r.parkedKeys(ctx, tx)
	if err != nil {
		return nil, nil, err
	}
	var cands []candidate
	read := func() error {
		cands = cands[:0]
		rows, err := tx.QueryContext(ctx, r.claimQ.pending)
		if err != nil {
			return fmt.Errorf("select pending outbox rows: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var c candidate
			if err := rows.Scan(&c.id, &c.key); err != nil {
				return fmt.Errorf("scan pending outbox row: %w", err)
			}
			cands = append(cands, c)
		}
		return rows.Err()
	}
	err = read()
	if err != nil || len(cands) == 0 {
		return nil, nil, err
	}
	// The candidates come from a plain read, so the transaction holds no lock while it
	// lingers.
	if again, err := r.linger(ctx, len(cands)); err != nil {
		return nil, nil, err
	} else if again {
		if err := read(); err != nil {
			return nil, nil, err
		}
	}
	after, err := r.parkedKeys(ctx, tx)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]int64, len(cands))
	for i, c := range cands {
		ids[i] = c.id
	}
	cond, args := r.dl.idIn("id", ids)
	rows, err := tx.QueryContext(ctx, r.dl.Rebind(r.claimQ.prefix+cond+r.claimQ.suffix), args...)
	if err != nil {
		return nil, nil, fmt.Errorf("lock pending outbox rows: %w", err)
	}
	defer rows.Close()
	var rd rowReader
	b := rd.start()
	for rows.Next() {
		id, err := rd.scan(rows)
		if err != nil {
			return nil, nil, err
		}
		if len(b.rows) > 0 && b.size() >= r.cfg.BatchBytes {
			// The batch is full by bytes: this row and the later candidates wait for the next
			// batch (their locks go with this transaction).
			cands = cands[:slices.IndexFunc(cands, func(c candidate) bool { return c.id >= id })]
			break
		}
		if err := rd.keep(b, id); err != nil {
			return nil, nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read outbox rows: %w", err)
	}
	rows.Close()
	claimed := rd.rows(b)
	locked := make(map[int64]outRow, len(claimed))
	for _, o := range claimed {
		locked[o.id] = o
	}
	batch := make([]outRow, len(cands))
	for i, c := range cands {
		o, ok := locked[c.id]
		if !ok {
			// Another relay holds it. screen makes it hold back every later candidate of its key.
			o = outRow{id: c.id, key: c.key}
		}
		batch[i] = o
	}
	s, err := screen(batch, after, releasedKeys(before, after), &checker{md: r.md, maxBytes: r.maxBytes})
	if err != nil {
		return nil, nil, err
	}
	moved, _, err := r.park(ctx, tx, s.park)
	if err != nil {
		return nil, nil, err
	}
	return s.send, moved, nil
}

func (r *atLeastOnce) mark(ctx context.Context, tx *sql.Tx, ids []int64) error {
	cond, args, _ := r.dl.idMatch(ids)
	if _, err := tx.ExecContext(ctx, r.dl.Rebind(r.q.markPrefix+cond), args...); err != nil {
		return fmt.Errorf("mark %d outbox rows published: %w", len(ids), err)
	}
	return nil
}

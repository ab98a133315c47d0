package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// batch publishes the oldest unpublished rows in one Kafka transaction with their position,
// then marks them. It marks them before it returns. When pipelined, it marks them in the
// background while the next batch is read and sent. See eosShard.
//
// Before sending, batch parks two kinds of rows with the code of parked.go. The first are
// rows Kafka would refuse, such as a row whose topic is missing from the metadata after a
// forced refresh, or a record over the producer's max message bytes. The second are the
// rows of keys with parked events. The batch is what remains, and its position covers
// exactly the rows sent in its transaction.
//
// When Kafka refuses rows of a send, batch aborts the transaction and errRefused ends the
// session. The refused rows are parked. When the errors do not say which rows caused them,
// isolation finds them over the next batches.
func (e *eosShard) batch(ctx context.Context, pipelined bool) (_ int, err error) {
	r, s, cfg := e.r, e.sess, e.r.cfg
	if m := s.marking; m != nil && isDone(m.done) {
		if err := e.collect(); err != nil {
			return 0, err
		}
	}
	// An idle relay, which nothing handed rows, looks for a pending row first: one
	// index-only query per poll instead of the parked keys and the pending ids. Once a row
	// is there, the batch reads as below.
	if e.idle && (r.handoff == nil || r.handoff.empty()) {
		if n, err := e.readPending(ctx, nil); err != nil || n == 0 {
			return 0, err
		}
	}
	// The parked keys are read before and after the pending read. See atLeastOnce.claim.
	before, err := r.parkedKeys(ctx, r.db)
	if err != nil {
		return 0, err
	}
	rows, err := e.pending(ctx)
	e.idle = err == nil && len(rows) == 0
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	after, err := r.parkedKeys(ctx, r.db)
	if err != nil {
		return 0, err
	}
	sc, err := screen(rows, after, releasedKeys(before, after), &checker{md: s.client, maxBytes: s.maxBytes})
	if err != nil {
		return 0, err
	}
	if len(sc.park) > 0 {
		var moved []parkEntry
		if err := dbx.InTx(ctx, r.db, func(tx *sql.Tx) error {
			var err error
			moved, _, err = r.park(ctx, tx, sc.park)
			return err
		}); err != nil {
			return 0, err
		}
		r.logParked(moved, e.shard)
		if h := r.handoff; h != nil {
			parked := make([]int64, len(sc.park))
			for i, p := range sc.park {
				parked[i] = p.row.id
			}
			h.drop(parked)
		}
	}
	batch := e.iso.cut(sc.send)
	if len(batch) == 0 {
		return 0, nil
	}
	ids := make([]int64, len(batch))
	eventIDs := make([]string, len(batch))
	msgs := make([]*sarama.ProducerMessage, 0, len(batch)+1)
	for i, o := range batch {
		ids[i], eventIDs[i] = o.id, o.eventID
		msgs = append(msgs, o.msg)
	}
	s.seq++
	pos := Position{V: 1, Kind: "batch", TxnID: e.txnID, Shard: e.shard, Owner: cfg.Owner, Session: s.id,
		Seq: s.seq, Events: len(ids), IDs: idRanges(ids), Digest: eventDigest(eventIDs), At: time.Now().UTC()}
	val, err := json.Marshal(pos)
	if err != nil {
		return 0, err
	}
	posMsg := &sarama.ProducerMessage{Topic: cfg.PositionsTopic, Key: sarama.StringEncoder(e.txnID), Value: sarama.ByteEncoder(val)}
	msgs = append(msgs, posMsg)
	if spans := r.startPublish(ctx, batch, e.shard); spans != nil { // the relay traces
		defer func() { endPublish(spans, err) }() // at the Kafka commit, or with the batch's error
	}
	if err := s.p.BeginTxn(); err != nil {
		return 0, fmt.Errorf("begin kafka transaction: %w", err)
	}
	if err := s.p.SendMessages(msgs); err != nil {
		return 0, e.refusedSend(ctx, batch, posMsg, err)
	}
	e.iso.outcome(batch, nil)
	// The previous batch must be marked before this one commits. Only the last committed
	// batch may be unmarked, because the next relay session reconciles only that one.
	if err := e.collect(); err != nil {
		return 0, err
	}
	r.hook("before-kafka-commit")
	if !e.lease.valid() {
		return 0, errLeaseLost
	}
	if err := s.p.CommitTxn(); err != nil {
		return 0, fmt.Errorf("commit kafka transaction (%d events): %w", len(ids), err)
	}
	r.hook("after-kafka-commit")
	// The batch is in Kafka. Mark it before anything else. If that fails, the session ends,
	// and the next one reconciles these rows from the position just committed.
	m := &markJob{ids: ids, seq: s.seq, done: make(chan struct{})}
	s.marking = m
	// Nothing holds the batch's messages any more, because the mark has the ids. The next
	// read may reuse their buffers, and the hand-off need not hold their rows.
	e.rd.recycle()
	if h := r.handoff; h != nil {
		h.drop(ids)
	}
	if !pipelined {
		e.markBatch(ctx, m)
		return len(ids), e.collect()
	}
	go e.markBatch(ctx, m)
	return len(ids), nil
}

// refusedSend handles a failed send of batch. The batch's transaction is open and will be
// aborted. refusedSend parks the rows Kafka refused for good and returns errRefused. When
// Kafka refused no row, it returns err as it is, and the batch is retried.
func (e *eosShard) refusedSend(ctx context.Context, batch []outRow, posMsg *sarama.ProducerMessage, err error) error {
	r := e.r
	res := sortSend(batch, posMsg, err)
	if len(res.unknown) > 0 {
		_ = e.sess.client.RefreshMetadata(res.unknown...) // the next batch's check sees the topic as it is now
	}
	if len(res.refused) == 0 {
		if res.firstFail != "" {
			return fmt.Errorf("publish %d events: %d failed, first %s: %w", len(batch), res.failed, res.firstFail, err)
		}
		return fmt.Errorf("publish %d events: %w", len(batch), err)
	}
	guilty := e.iso.outcome(batch, res.refused)
	if len(guilty) == 0 {
		r.logger.Error("outbox relay: Kafka refused events of a batch and did not say which; sending them in smaller batches to find out",
			err, watermill.LogFields{"shard": e.shard, "refused": len(res.refused), "suspects": len(e.iso.suspects), "first": res.firstFail})
		return fmt.Errorf("%w: isolating %d suspects", errRefused, len(e.iso.suspects))
	}
	entries := make([]parkEntry, 0, len(guilty))
	for _, i := range guilty {
		o := batch[i]
		entries = append(entries, parkEntry{row: o, reason: res.reasons[i], err: refusal{res.reasons[i], res.errs[i]}.text(o)})
	}
	// The transaction is aborted when the session ends and is never committed. So these rows
	// are in no committed batch, and parking them leaves every position's rows in the outbox.
	var moved []parkEntry
	if perr := dbx.InTx(ctx, r.db, func(tx *sql.Tx) error {
		var err error
		moved, _, err = r.park(ctx, tx, entries)
		return err
	}); perr != nil {
		return fmt.Errorf("publish %d events: kafka refused %s; parking it failed: %w", len(batch), batch[guilty[0]], perr)
	}
	r.logParked(moved, e.shard)
	return fmt.Errorf("%w: %d parked", errRefused, len(moved))
}

// pending reads the shard's oldest unpublished rows, up to a batch.
//
// With relay.linger, pending first counts the rows by their ids alone, in an index-only
// read. A partial batch lingers. The rows are then read in full once, from the start, so
// rows that committed out of id order meanwhile take their place in id order. So the
// database reads each row of a partial batch once in full.
//
// With the hand-off of handoff.go, pending reads the batch's ids by themselves after the
// linger. It takes the rows from the hand-off when the hand-off holds every one of them.
// Otherwise it reads them in full.
func (e *eosShard) pending(ctx context.Context) ([]outRow, error) {
	h := e.r.handoff
	if h != nil && h.empty() {
		h = nil // nothing handed over, as for another process's rows or a standby's start
	}
	if e.r.cfg.Linger > 0 || h != nil {
		var mark uint64
		if h != nil {
			mark = h.mark()
		}
		n, err := e.readPending(ctx, nil)
		if err != nil || n == 0 {
			return nil, err
		}
		lingered, err := e.r.linger(ctx, n)
		if err != nil {
			return nil, err
		}
		if h != nil {
			if lingered {
				mark = h.mark()
				if n, err = e.readPending(ctx, nil); err != nil || n == 0 {
					return nil, err
				}
			}
			h.dropStale(e.pendIDs[0], mark, e.index, e.r.cfg.Shards)
			if taken := h.take(e.pendIDs, e.pendHashes, e.handed); taken != nil {
				e.handed = taken
				rows := handedWithin(taken, e.r.cfg.BatchBytes)
				b := e.rd.start()
				for i := range rows {
					if err := e.rd.keepHanded(b, e.pendIDs[i], &rows[i]); err != nil {
						return nil, err
					}
				}
				clear(taken) // the hand-off keeps its rows until they are published
				return e.rd.rows(b), nil
			}
		}
	}
	e.r.hook("read")
	b := e.rd.start()
	if _, err := e.readPending(ctx, b); err != nil {
		return nil, err
	}
	return e.rd.rows(b), nil
}

// handedWithin is the first of rows within RelayConfig.BatchBytes, by their sizes in the
// hand-off: up to and with the row that reaches it, as a read stops. The rest stay in the
// hand-off for the next batch.
func handedWithin(rows []handedRow, limit int) []handedRow {
	size := 0
	for i := range rows {
		if i > 0 && size >= limit {
			return rows[:i]
		}
		size += rows[i].size
	}
	return rows
}

// readPending reads the shard's oldest unpublished rows, up to a batch, into b. It returns
// how many it read. When b is nil, it reads only their ids and key hashes, in an index-only
// read, into e.pendIDs and e.pendHashes.
func (e *eosShard) readPending(ctx context.Context, b *rowBatch) (int, error) {
	// Rows of a batch whose mark is still running are in Kafka already, so read past them.
	// When they form id ranges, the query leaves them out, and they are not read twice.
	// That is the common case. Otherwise read that many more rows and drop them here.
	var skip map[int64]bool
	query, where, args := e.pendingQ, e.pendingWhere, []any{e.r.cfg.BatchSize}
	if b == nil {
		query, where = e.pendingIDsQ, e.pendingIDsWhere
	}
	if m := e.sess.marking; m != nil {
		if cond, cargs, ranges := e.r.dl.idMatch(m.ids); ranges {
			query, args = e.r.dl.Rebind(where+" AND NOT "+cond+e.pendingOrder), append(cargs, e.r.cfg.BatchSize)
		} else {
			skip = make(map[int64]bool, len(m.ids))
			for _, id := range m.ids {
				skip[id] = true
			}
			args[0] = e.r.cfg.BatchSize + len(skip)
		}
	}
	rows, err := e.r.db.QueryContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("select pending outbox rows: %w", err)
	}
	defer rows.Close()
	n := 0
	e.pendIDs, e.pendHashes = e.pendIDs[:0], e.pendHashes[:0]
	for rows.Next() {
		var id, hash int64
		if b == nil {
			if err := rows.Scan(&id, &hash); err != nil {
				return 0, fmt.Errorf("scan outbox row id: %w", err)
			}
		} else if id, err = e.rd.scan(rows); err != nil {
			return 0, err
		}
		if skip[id] || n == e.r.cfg.BatchSize {
			continue
		}
		if b != nil && n > 0 && b.size() >= e.r.cfg.BatchBytes {
			break // the rest waits for the next batch
		}
		n++
		if b == nil {
			e.pendIDs, e.pendHashes = append(e.pendIDs, id), append(e.pendHashes, hash)
			continue
		}
		if err := e.rd.keep(b, id); err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read outbox rows: %w", err)
	}
	return n, nil
}

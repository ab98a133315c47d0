package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// lastBatchPosition returns the last batch record of this transactional id before this relay
// session's init record, which is at offset initOff. It reads the positions partition with
// read_committed isolation, backwards from initOff in growing windows.
func (e *eosShard) lastBatchPosition(ctx context.Context, part int32, initOff int64, sessionID string) (Position, bool, error) {
	cfg := e.r.cfg
	sc := e.saramaConfig(e.kc.ConsumerConfig())
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Return.Errors = true
	client, err := sarama.NewClient(e.kc.Brokers, sc)
	if err != nil {
		return Position{}, false, kafkax.Unreachable(e.kc.Brokers, err)
	}
	defer client.Close()
	oldest, err := client.GetOffset(cfg.PositionsTopic, part, sarama.OffsetOldest)
	if err != nil {
		return Position{}, false, fmt.Errorf("positions topic oldest offset: %w", err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return Position{}, false, err
	}
	defer consumer.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.TxnTimeout+30*time.Second)
	defer cancel()
	for window := int64(64); ; window *= 8 {
		start := max(oldest, initOff-window)
		pos, found, err := e.scanPositions(ctx, consumer, part, start, initOff, sessionID)
		if err != nil || found || start == oldest {
			return pos, found, err
		}
	}
}

func (e *eosShard) scanPositions(ctx context.Context, consumer sarama.Consumer, part int32, start, initOff int64, sessionID string) (Position, bool, error) {
	cfg := e.r.cfg
	pc, err := consumer.ConsumePartition(cfg.PositionsTopic, part, start)
	if err != nil {
		return Position{}, false, fmt.Errorf("read positions %s/%d from %d: %w", cfg.PositionsTopic, part, start, err)
	}
	defer pc.Close()
	var (
		last  Position
		found bool
	)
	for {
		select {
		case m := <-pc.Messages():
			if m.Offset >= initOff {
				var p Position
				if m.Offset != initOff || json.Unmarshal(m.Value, &p) != nil || p.Session != sessionID {
					return Position{}, false, fmt.Errorf("positions %s/%d: offset %d is not this relay session's init record", cfg.PositionsTopic, part, m.Offset)
				}
				return last, found, nil
			}
			if string(m.Key) != e.txnID {
				continue
			}
			var p Position
			if err := json.Unmarshal(m.Value, &p); err != nil || p.Kind != "batch" {
				return Position{}, false, fmt.Errorf("positions %s/%d@%d: bad batch record: %v", cfg.PositionsTopic, part, m.Offset, err)
			}
			last, found = p, true
		case err := <-pc.Errors():
			return Position{}, false, fmt.Errorf("read positions: %w", err)
		case <-ctx.Done():
			return Position{}, false, fmt.Errorf("read positions up to offset %d: %w", initOff, ctx.Err())
		}
	}
}

// reconcile marks the rows of a batch that is committed in Kafka.
func (e *eosShard) reconcile(ctx context.Context, p Position) (int64, error) {
	var total int64
	tx, err := e.r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("reconcile: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	// Only a position that describes this table's rows may mark them. See Position.Digest.
	var eventIDs []string
	sel := e.r.dl.Rebind(fmt.Sprintf(`SELECT event_id FROM %s WHERE id BETWEEN ? AND ? ORDER BY id FOR UPDATE`, e.r.cfg.Table))
	for _, rg := range p.IDs {
		rows, err := tx.QueryContext(ctx, sel, rg[0], rg[1])
		if err != nil {
			return 0, fmt.Errorf("reconcile ids %d..%d: %w", rg[0], rg[1], err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, fmt.Errorf("reconcile: %w", err)
			}
			eventIDs = append(eventIDs, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("reconcile: %w", err)
		}
	}
	if p.Digest == "" || len(eventIDs) != p.Events || eventDigest(eventIDs) != p.Digest {
		e.foreignPosition(p, len(eventIDs))
		return 0, nil
	}
	q := e.r.dl.Rebind(fmt.Sprintf(`UPDATE %s SET published_at = %s WHERE published_at IS NULL AND id BETWEEN ? AND ?`, e.r.cfg.Table, e.r.dl.now()))
	for _, rg := range p.IDs {
		res, err := tx.ExecContext(ctx, q, rg[0], rg[1])
		if err != nil {
			return 0, fmt.Errorf("reconcile ids %d..%d: %w", rg[0], rg[1], err)
		}
		n, _ := res.RowsAffected()
		total += n
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("reconcile commit: %w", err)
	}
	e.reconciled.Add(total)
	return total, nil
}

// msgForeignPosition is what the relay logs at WARN when the last batch its positions topic
// holds under its transactional id is not of this database's outbox rows. The relay then
// reconciles nothing. This is harmless to the rows not yet published.
const msgForeignPosition = "outbox relay: the last batch in the positions topic under this transactional id is not of this database's outbox rows, so nothing is reconciled; " +
	"harmless to the rows not yet published, which are published as usual. " +
	"After `router migrate --reset` or a restore of this database nothing needs doing: this stops once the relay has published a batch of this database. " +
	"Otherwise another database relays under the same relay.transactional_id: give each database its own"

// foreignPosition logs that p, the last batch position of the shard's transactional id, is
// not of this database's rows. found counts the rows of this database that match p's events.
// It logs at WARN once per batch and shard in this process, and at DEBUG when a later
// session finds the same batch. The caller holds mu.
func (e *eosShard) foreignPosition(p Position, found int) {
	fields := watermill.LogFields{"transactional_id": p.TxnID, "positions_topic": e.r.cfg.PositionsTopic,
		"batch_session": p.Session, "batch_seq": p.Seq, "batch_events": p.Events, "rows_found": found}
	seen := fmt.Sprintf("%s/%d", p.Session, p.Seq)
	if e.foreignSeen == seen {
		e.r.logger.Debug("outbox relay: the positions topic's last batch is still not of this database's outbox rows", fields)
		return
	}
	e.foreignSeen = seen
	warn(e.r.logger, msgForeignPosition, fields)
}

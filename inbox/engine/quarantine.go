package engine

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// A quarantine must not fail on what the record holds. Whatever its bytes, quarantineRow
// makes the row storable. Should the database still refuse it, a minimal row is written
// instead, with the key, source, reason, hash and size. Only an unreachable database, or a
// cancelled context, leaves the message un-acked.

// poisonPrefixBytes is how much of a payload over inbox.max_payload_bytes is kept. It is as
// much as a subscriber keeps of a value it cut before it waited.
const poisonPrefixBytes = msgsource.CutPrefixBytes

// storedPayload returns the payload column's value for a record value. A nil value, a
// Kafka tombstone, is stored empty and flagged, since the column is NOT NULL.
func storedPayload(p []byte) ([]byte, bool) {
	if p == nil {
		return []byte{}, true
	}
	return p, false
}

// quarantineRow is the stored form of a quarantined delivery.
type quarantineRow struct {
	key, uuid, fp, errText string
	payload                []byte
	meta                   any // JSON text, or nil
	tombstone              bool
	size                   any // original payload size when payload holds less, else nil
}

func (ib *Inbox) newQuarantineRow(msg *message.Message, key, fp string, cause error) quarantineRow {
	q := quarantineRow{key: key, uuid: messageUUID(msg), fp: fp, errText: errorText(cause)}
	q.payload, q.tombstone = storedPayload(msg.Payload)
	if size := payloadSize(msg); size > ib.cfg.MaxPayloadBytes {
		q.size = size
		q.payload = q.payload[:min(len(q.payload), poisonPrefixBytes, ib.cfg.MaxPayloadBytes)]
	}
	q.meta, _ = metadataJSON(msg.Metadata, ib.cfg.MaxMetadataBytes)
	return q
}

// minimal is q without content. It is what is left when the database refused q with
// refusal.
func (q quarantineRow) minimal(msg *message.Message, refusal error) quarantineRow {
	m := q
	m.payload, m.meta, m.size = []byte{}, nil, payloadSize(msg)
	m.errText = validText(fmt.Sprintf("stored without its payload and metadata: the database refused the full row (%v); cause: %s", refusal, q.errText), maxErrorBytes)
	return m
}

// quarantine records a failed row in its own transaction. A row that is already 'done'
// stays done, because another delivery finished it meanwhile.
func (ib *Inbox) quarantine(ctx context.Context, msg *message.Message, src inbox.Source, key, fp string, reason Reason, cause error, attempts int, opts runOpts) (Result, error) {
	q := ib.newQuarantineRow(msg, key, fp, cause)
	if opts.notes != "" {
		q.errText = validText(opts.notes+q.errText, maxErrorBytes)
	}
	id, done, err := ib.insertQuarantine(ctx, q, src, reason, attempts, opts)
	if err != nil && ctx.Err() == nil && !dbx.IsConnError(err) && !dbx.IsLockConflict(err) {
		ib.logger.Error("quarantine row refused by the database, writing a minimal row", err,
			watermill.LogFields{ib.cfg.KeyLogField: key, "topic": src.Topic, "partition": src.Partition, "offset": src.Offset, "reason": string(reason)})
		id, done, err = ib.insertQuarantine(ctx, q.minimal(msg, err), src, reason, attempts, opts)
	}
	if err != nil {
		return Result{}, fmt.Errorf("quarantine %q (%s): %w", key, reason, err)
	}
	if done {
		// The key's row is done. Another delivery finished it, or an operator resolved it.
		// So this delivery is a counted duplicate.
		return Result{Outcome: OutcomeDuplicate, InboxID: id, Key: key, Attempts: attempts}, nil
	}
	out := OutcomeQuarantined
	if reason == ReasonConflict {
		out = OutcomeConflict
	}
	return Result{Outcome: out, InboxID: id, Key: key, Reason: reason, Attempts: attempts, Err: cause}, nil
}

// insertQuarantine writes q, retrying deadlocks and lock waits. done reports a row that
// was done already. It stays so, and the delivery is counted on it as a duplicate.
func (ib *Inbox) insertQuarantine(ctx context.Context, q quarantineRow, src inbox.Source, reason Reason, attempts int, opts runOpts) (id int64, done bool, err error) {
	for try := 0; ; try++ {
		err = dbx.InTx(ctx, ib.db, func(tx *sql.Tx) error {
			args := []any{q.key, ib.cfg.BizType, string(StatusFailed), string(reason), q.uuid, src.Topic, src.Partition, src.Offset,
				q.payload, q.meta, q.fp, attempts, q.errText, nullID(opts.ReplayID), time.Now().Add(ib.cfg.Retention).UTC(), q.tombstone, q.size}
			var status Status
			if ib.q.returning {
				if err := tx.QueryRowContext(ctx, ib.q.quarantine, args...).Scan(&id, &status); err != nil {
					return err
				}
			} else {
				r, err := tx.ExecContext(ctx, ib.q.quarantine, args...)
				if err != nil {
					return err
				}
				if id, err = r.LastInsertId(); err != nil {
					return err
				}
				var n int
				if err := tx.QueryRowContext(ctx, ib.q.attempts, id).Scan(&status, &n); err != nil {
					return err
				}
			}
			if done = status == StatusDone; done {
				if _, err := tx.ExecContext(ctx, ib.q.countDuplicate, id); err != nil {
					return fmt.Errorf("count duplicate: %w", err)
				}
				return nil
			}
			return ib.stamp(ctx, tx, opts.ReplayID, id)
		})
		if err == nil || !dbx.IsLockConflict(err) || try >= ib.cfg.MaxLockRetries {
			return id, done, err
		}
		sleep(ctx, time.Duration(1+rand.IntN(20))*time.Millisecond)
	}
}

func (ib *Inbox) quarantineConflict(ctx context.Context, d *inbox.Delivery, dec decoded, opts runOpts) (Result, error) {
	tag := shortFingerprint(dec.Fingerprint)
	key := d.Key + "#conflict:" + tag
	cause := fmt.Errorf("key %q already processed with a different payload (fingerprint %s)", d.Key, tag)
	ib.logger.Error("conflicting payload for a known key quarantined", cause, watermill.LogFields{ib.cfg.KeyLogField: d.Key, "topic": d.Source.Topic, "partition": d.Source.Partition, "offset": d.Source.Offset})
	return ib.quarantine(ctx, d.Message, d.Source, key, dec.Fingerprint, ReasonConflict, cause, d.Attempt, opts)
}

// countFailure records a failed attempt on the delivery's row, in its own transaction. It
// returns the attempts the key has failed so far in every process. So a record that keeps
// failing is quarantined after inbox.max_attempts. That holds even when the processes
// running it are killed, or lose its partition, before their own count runs out. The row
// it leaves is 'processing'. The redelivery resumes it, and nothing of the failed attempt
// is kept. Should the count not be recorded, this process's attempt number stands in for
// it.
func (ib *Inbox) countFailure(ctx context.Context, msg *message.Message, src inbox.Source, dec decoded, cause error, attempt int, opts runOpts) int {
	payload, tombstone := storedPayload(msg.Payload)
	var status Status
	var total int
	err := dbx.InTx(ctx, ib.db, func(tx *sql.Tx) error {
		args := []any{dec.Key, ib.cfg.BizType, string(StatusProcessing), nil, messageUUID(msg), src.Topic, src.Partition, src.Offset,
			payload, dec.meta, dec.Fingerprint, 1, errorText(cause), nullID(opts.ReplayID), time.Now().Add(ib.cfg.Retention).UTC(), tombstone, nil}
		if ib.q.returning {
			return tx.QueryRowContext(ctx, ib.q.failure, args...).Scan(&status, &total)
		}
		r, err := tx.ExecContext(ctx, ib.q.failure, args...)
		if err != nil {
			return err
		}
		id, err := r.LastInsertId()
		if err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, ib.q.attempts, id).Scan(&status, &total)
	})
	if err != nil || status != StatusProcessing {
		// The count was not recorded, or the row is done or quarantined meanwhile. The next
		// attempt finds it so.
		if err != nil && ctx.Err() == nil {
			ib.logger.Info("failed attempt not recorded on the inbox row", watermill.LogFields{ib.cfg.KeyLogField: dec.Key, "err": validText(err.Error(), 1000)})
		}
		return attempt
	}
	return max(total, attempt)
}

// poisonNotes returns the notes that begin a poison row's last error. They hold the
// record's Kafka key, when the message's context holds it, and the payload's id. See
// msgsource.Notes.
func (ib *Inbox) poisonNotes(msg *message.Message) string {
	key, hasKey := msgsource.Key(msg.Context())
	return msgsource.Notes(key, hasKey, payloadID(msg.Payload, idFields(ib.cfg.KeyLogField)))
}

// idFields are the names of the JSON field that holds a payload's business key, as the
// plugin names the key in log lines: "order_id" and "orderId" for "order_id".
func idFields(logField string) []string {
	out := []string{logField}
	parts := strings.Split(logField, "_")
	for i := 1; i < len(parts); i++ {
		if p := parts[i]; p != "" {
			parts[i] = strings.ToUpper(p[:1]) + p[1:]
		}
	}
	if camel := strings.Join(parts, ""); camel != logField {
		out = append(out, camel)
	}
	return out
}

// payloadID returns the value of the first of fields in payload, when payload is a JSON
// object that holds it as a string or a number before anything it cannot read. A poison
// payload is often JSON that breaks later, or lacks another field, so payloadID reads its
// fields one by one and stops at the first error. It returns "" when it finds no such value,
// or one that is not UTF-8 as sent. encoding/json would replace those bytes.
func payloadID(payload []byte, fields []string) string {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ""
		}
		name, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return ""
		}
		if !slices.Contains(fields, name) {
			continue
		}
		switch {
		case len(raw) > 0 && raw[0] == '"' && utf8.Valid(raw):
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return ""
			}
			return s
		case len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'):
			return string(raw)
		}
		return ""
	}
	return ""
}

package engine

import (
	"fmt"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// queries holds the SQL of one inbox table, in the pool's dialect. Config validated the
// table name.
type queries struct {
	claim, quarantine, lock, countDuplicate, reopen, markDone, stamp string
	failure, attempts                                                string
	delayLock, delay                                                 string // a delayed redelivery (delay.go)
	// returning reports that claim, quarantine and failure read their row back themselves,
	// instead of with LAST_INSERT_ID and a SELECT. PostgreSQL does so with INSERT … ON
	// CONFLICT … RETURNING.
	returning bool
}

const insertColumns = `(dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset,
 payload, metadata, fingerprint, attempts, last_error, replay_id, expire_at, tombstone, payload_size)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// conflictKey is the inbox's unique key, the target of PostgreSQL's ON CONFLICT.
const conflictKey = " ON CONFLICT (dedup_key, biz_type) DO UPDATE SET "

func newQueries(table string, d dbx.Dialect) queries {
	q := queries{
		lock:           fmt.Sprintf(`SELECT status, fingerprint, reason FROM %s WHERE id = ? FOR UPDATE`, table),
		countDuplicate: fmt.Sprintf(`UPDATE %s SET duplicates = duplicates + 1 WHERE id = ?`, table),
		// A quarantined row run again by a replay gets a fresh count of attempts.
		// A quarantined row, but not one waiting for a delayed redelivery, also gets fresh
		// delayed rounds. MariaDB assigns left to right, so status is assigned after the
		// tests.
		reopen: fmt.Sprintf(`UPDATE %s SET delayed_rounds = CASE WHEN status = 'failed' AND COALESCE(reason, '') <> 'delayed' THEN 0 ELSE delayed_rounds END,
 retry_at = NULL, attempts = CASE WHEN status = 'failed' THEN 0 ELSE attempts END, status = 'processing', reason = NULL,
 replay_id = COALESCE(?, replay_id) WHERE id = ?`, table),
		attempts:  fmt.Sprintf(`SELECT status, attempts FROM %s WHERE id = ?`, table),
		markDone:  fmt.Sprintf(`UPDATE %s SET status = 'done', attempts = GREATEST(attempts, ?), reason = NULL, last_error = NULL, retry_at = NULL WHERE id = ?`, table),
		delayLock: fmt.Sprintf(`SELECT id, status, delayed_rounds FROM %s WHERE dedup_key = ? AND biz_type = ? FOR UPDATE`, table),
		delay: fmt.Sprintf(`UPDATE %s SET status = 'failed', reason = 'delayed', retry_at = ?, delayed_rounds = delayed_rounds + 1,
 attempts = GREATEST(attempts, ?), last_error = ?, replay_id = COALESCE(?, replay_id) WHERE id = ?`, table),
	}
	if d.IsPostgres() {
		// These are the same statements as ON CONFLICT upserts, each reading its row back.
		// A SET expression sees the row as it was, so there is no assignment order to mind.
		// The update locks an existing row. A row this statement inserted has xmax = 0. The
		// new version an ON CONFLICT update leaves carries the updating transaction in xmax.
		// The claim's update assigns nothing new, because updated_at moves only on a change.
		q.returning = true
		q.claim = fmt.Sprintf(`INSERT INTO %[1]s %[2]s`+conflictKey+`status = %[1]s.status
 RETURNING id, (xmax = 0) AS inserted, status, fingerprint, reason`, table, insertColumns)
		q.quarantine = fmt.Sprintf(`INSERT INTO %[1]s %[2]s`+conflictKey+`
 reason = CASE WHEN %[1]s.status = 'done' THEN %[1]s.reason ELSE EXCLUDED.reason END,
 last_error = CASE WHEN %[1]s.status = 'done' THEN %[1]s.last_error ELSE EXCLUDED.last_error END,
 attempts = CASE WHEN %[1]s.status = 'done' THEN %[1]s.attempts ELSE GREATEST(%[1]s.attempts, EXCLUDED.attempts) END,
 replay_id = CASE WHEN %[1]s.status = 'done' THEN %[1]s.replay_id ELSE COALESCE(EXCLUDED.replay_id, %[1]s.replay_id) END,
 status = CASE WHEN %[1]s.status = 'done' THEN 'done' ELSE 'failed' END
 RETURNING id, status`, table, insertColumns)
		q.failure = fmt.Sprintf(`INSERT INTO %[1]s %[2]s`+conflictKey+`
 last_error = CASE WHEN %[1]s.status = 'processing' THEN EXCLUDED.last_error ELSE %[1]s.last_error END,
 attempts = CASE WHEN %[1]s.status = 'processing' THEN %[1]s.attempts + 1 ELSE %[1]s.attempts END
 RETURNING status, attempts`, table, insertColumns)
		q.stamp = `INSERT INTO ` + replayRowTable + ` (replay_id, inbox_id) VALUES (?, ?) ON CONFLICT DO NOTHING`
	} else {
		q.claim = fmt.Sprintf(`INSERT INTO %s %s ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)`, table, insertColumns)
		// MariaDB evaluates ON DUPLICATE KEY UPDATE assignments left to right, so status,
		// which the others test, is assigned last.
		q.quarantine = fmt.Sprintf(`INSERT INTO %s %s ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id),
 reason = IF(status = 'done', reason, VALUES(reason)),
 last_error = IF(status = 'done', last_error, VALUES(last_error)),
 attempts = IF(status = 'done', attempts, GREATEST(attempts, VALUES(attempts))),
 replay_id = IF(status = 'done', replay_id, COALESCE(VALUES(replay_id), replay_id)),
 status = IF(status = 'done', 'done', 'failed')`, table, insertColumns)
		// failure counts a failed attempt on the row in its own transaction, because
		// attempts are bounded across processes, not per process. A new row is inserted as
		// 'processing', a row to resume and never a dedup mark. An existing 'processing' row
		// gets one attempt more.
		q.failure = fmt.Sprintf(`INSERT INTO %s %s ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id),
 last_error = IF(status = 'processing', VALUES(last_error), last_error),
 attempts = IF(status = 'processing', attempts + 1, attempts)`, table, insertColumns)
		// stamp lists the row as one this replay stamped, because inbox.replay_id has no
		// index.
		q.stamp = `INSERT INTO ` + replayRowTable + ` (replay_id, inbox_id) VALUES (?, ?) ON DUPLICATE KEY UPDATE inbox_id = inbox_id`
	}
	for _, s := range []*string{&q.claim, &q.quarantine, &q.lock, &q.countDuplicate, &q.reopen, &q.markDone, &q.stamp, &q.failure, &q.attempts, &q.delayLock, &q.delay} {
		*s = d.Rebind(*s)
	}
	return q
}

// replayRowTable lists the inbox rows each replay stamped, whatever the inbox table.
// Migration 00007 creates it, and inboxops reads it.
const replayRowTable = "replay_row"

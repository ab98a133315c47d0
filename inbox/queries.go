package inbox

import "fmt"

// queries holds the SQL of one inbox table; the table name was validated by Config.
type queries struct {
	claim, quarantine, lock, countDuplicate, reopen, markDone, stamp string
	failure, attempts                                                string
}

const insertColumns = `(dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset,
 payload, metadata, fingerprint, attempts, last_error, replay_id, expire_at, tombstone, payload_size)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

func newQueries(table string) queries {
	return queries{
		claim: fmt.Sprintf(`INSERT INTO %s %s ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)`, table, insertColumns),
		// MariaDB evaluates ON DUPLICATE KEY UPDATE assignments left to right, so status,
		// which the others test, is assigned last.
		quarantine: fmt.Sprintf(`INSERT INTO %s %s ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id),
 reason = IF(status = 'done', reason, VALUES(reason)),
 last_error = IF(status = 'done', last_error, VALUES(last_error)),
 attempts = IF(status = 'done', attempts, GREATEST(attempts, VALUES(attempts))),
 replay_id = IF(status = 'done', replay_id, COALESCE(VALUES(replay_id), replay_id)),
 status = IF(status = 'done', 'done', 'failed')`, table, insertColumns),
		lock:           fmt.Sprintf(`SELECT status, fingerprint, reason FROM %s WHERE id = ? FOR UPDATE`, table),
		countDuplicate: fmt.Sprintf(`UPDATE %s SET duplicates = duplicates + 1 WHERE id = ?`, table),
		// A quarantined row run again by a replay gets a fresh count of attempts.
		reopen: fmt.Sprintf(`UPDATE %s SET attempts = IF(status = 'failed', 0, attempts), status = 'processing', reason = NULL,
 replay_id = COALESCE(?, replay_id) WHERE id = ?`, table),
		// A failed attempt, counted on the row in its own transaction (attempts are bounded
		// across processes, not per process): inserted 'processing' — a row to resume, never a
		// dedup mark — or, on an existing 'processing' row, one attempt more.
		failure: fmt.Sprintf(`INSERT INTO %s %s ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id),
 last_error = IF(status = 'processing', VALUES(last_error), last_error),
 attempts = IF(status = 'processing', attempts + 1, attempts)`, table, insertColumns),
		attempts: fmt.Sprintf(`SELECT status, attempts FROM %s WHERE id = ?`, table),
		markDone: fmt.Sprintf(`UPDATE %s SET status = 'done', attempts = GREATEST(attempts, ?), reason = NULL, last_error = NULL WHERE id = ?`, table),
		// The row listed as one this replay stamped (inbox.replay_id has no index).
		stamp: `INSERT INTO ` + replayRowTable + ` (replay_id, inbox_id) VALUES (?, ?) ON DUPLICATE KEY UPDATE inbox_id = inbox_id`,
	}
}

// replayRowTable lists the inbox rows each replay stamped (migrations/00007; inboxops reads
// it), whatever the inbox table.
const replayRowTable = "replay_row"

package inbox

import "fmt"

// queries holds the SQL of one inbox table; the table name was validated by Config.
type queries struct {
	claim, quarantine, lock, countDuplicate, reopen, markDone, stamp string
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
		reopen:         fmt.Sprintf(`UPDATE %s SET status = 'processing', reason = NULL, replay_id = COALESCE(?, replay_id) WHERE id = ?`, table),
		markDone:       fmt.Sprintf(`UPDATE %s SET status = 'done', attempts = GREATEST(attempts, ?), reason = NULL, last_error = NULL WHERE id = ?`, table),
		// The row listed as one this replay stamped (inbox.replay_id has no index).
		stamp: `INSERT INTO ` + ReplayRowTable + ` (replay_id, inbox_id) VALUES (?, ?) ON DUPLICATE KEY UPDATE inbox_id = inbox_id`,
	}
}

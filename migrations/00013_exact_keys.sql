-- +goose Up
-- Keys compare exactly. The tables' collation, utf8mb4_bin, is PAD SPACE: it compares
-- 'h1-g1 ' equal to 'h1-g1', so a key with trailing spaces was taken for another key's
-- duplicate (a Kafka delivery, an HTTP command's client token). utf8mb4_nopad_bin compares
-- code point by code point, trailing spaces included (checked on MariaDB 10.11). No two rows
-- can collide by it (it tells more keys apart, never fewer). The unique key
-- uk_dedup (dedup_key, biz_type) and idx_biz_status_created are rebuilt in place while the
-- inbox stays readable and writable (NOCOPY, LOCK=NONE: the statement fails rather than
-- block the consumers). VARCHAR(191) of utf8mb4 and VARCHAR(64) fit the index as before.
-- MariaDB refuses to compare two columns of different collations: a query that joins these
-- with a utf8mb4_bin column (a plugin table not migrated likewise) names the collation,
-- e.g. ON p.order_id = i.dedup_key COLLATE utf8mb4_nopad_bin.
ALTER TABLE inbox
    MODIFY dedup_key VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY biz_type  VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = NOCOPY, LOCK = NONE;

-- An event's key is the aggregate's (an order id): compared with the plugins' ids (an audit
-- groups a grant with its events by it), so it compares exactly too, and in the same
-- collation (MariaDB refuses to compare, join or UNION columns of two collations). It is
-- indexed only through key_hash, CRC32 of its bytes, which does not change: instant.
ALTER TABLE outbox MODIFY msg_key VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, ALGORITHM = INSTANT;
ALTER TABLE outbox_parked MODIFY msg_key VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, ALGORITHM = INSTANT;

-- An HTTP command's client token that begins with "sha256:" is now stored as its digest
-- (inbox.CommandKey), as a token longer than 128 bytes is, so no token's key is another's
-- digest. Rows written by the HTTP listener (source topic "http <method> <path>",
-- partition -1) under the earlier rule, which kept such a token as itself, get the key the
-- token now has, so a retry still finds its row. A stored "sha256:" and 64 hex digits is left
-- as it is: it was a long token's digest, or a token that looked like one, and the two
-- cannot be told apart; it stays the long token's.
UPDATE inbox SET dedup_key = CONCAT('sha256:', SHA2(dedup_key, 256))
 WHERE topic LIKE 'http %' AND kafka_partition = -1
   AND dedup_key LIKE 'sha256:%' AND dedup_key NOT REGEXP '^sha256:[0-9a-f]{64}$';

-- +goose Down
-- Back to PAD SPACE; fails (duplicate key) once two keys differ only in trailing spaces.
-- Tokens rewritten to their digest stay so.
ALTER TABLE outbox_parked MODIFY msg_key VARCHAR(191) NOT NULL, ALGORITHM = INSTANT;
ALTER TABLE outbox MODIFY msg_key VARCHAR(191) NOT NULL, ALGORITHM = INSTANT;
ALTER TABLE inbox
    MODIFY dedup_key VARCHAR(191) NOT NULL,
    MODIFY biz_type  VARCHAR(64)  NOT NULL,
    ALGORITHM = NOCOPY, LOCK = NONE;

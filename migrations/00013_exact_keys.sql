-- +goose Up
-- Keys compare exactly. The tables' collation, utf8mb4_bin, is PAD SPACE. It compares
-- 'h1-g1 ' equal to 'h1-g1'. So a key with trailing spaces would be taken for another key's
-- duplicate, for a Kafka delivery or an HTTP command's client token. utf8mb4_nopad_bin
-- compares code point by code point, trailing spaces included, on MariaDB 10.11. No two
-- rows can collide by it, because it tells more keys apart, never fewer.
--
-- The unique key uk_dedup on dedup_key and biz_type, and idx_biz_status_created, are
-- rebuilt in place while the inbox stays readable and writable. With NOCOPY and LOCK=NONE
-- the statement fails rather than block the consumers. VARCHAR(191) of utf8mb4 and
-- VARCHAR(64) fit the index as before.
--
-- MariaDB refuses to compare two columns of different collations. A query that joins these
-- with a utf8mb4_bin column, such as one of a plugin table not migrated likewise, names the
-- collation, as in ON p.order_id = i.dedup_key COLLATE utf8mb4_nopad_bin.
ALTER TABLE inbox
    MODIFY dedup_key VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY biz_type  VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = NOCOPY, LOCK = NONE;

-- An event's key is the aggregate's, such as an order id. It is compared with the plugins'
-- ids, as when an audit groups a grant with its events. So it compares exactly too, and in
-- the same collation, since MariaDB refuses to compare, join or UNION columns of two
-- collations. It is indexed only through key_hash, the CRC32 of its bytes, which does not
-- change. So the change is instant.
ALTER TABLE outbox MODIFY msg_key VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, ALGORITHM = INSTANT;
ALTER TABLE outbox_parked MODIFY msg_key VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, ALGORITHM = INSTANT;

-- An HTTP command's client token that begins with "sha256:" is stored as its digest by
-- inbox.CommandKey, as a token longer than 128 bytes is. So no token's key is another's
-- digest. The HTTP listener's rows have the source topic "http <method> <path>" and
-- partition -1. Those written under the earlier rule kept such a token as itself. They get
-- the key the token has now, so a retry still finds its row. A stored "sha256:" and 64 hex
-- digits is left as it is. It was a long token's digest, or a token that looked like one,
-- and the two cannot be told apart. It stays the long token's.
UPDATE inbox SET dedup_key = CONCAT('sha256:', SHA2(dedup_key, 256))
 WHERE topic LIKE 'http %' AND kafka_partition = -1
   AND dedup_key LIKE 'sha256:%' AND dedup_key NOT REGEXP '^sha256:[0-9a-f]{64}$';

-- +goose Down
-- Back to PAD SPACE. This fails with a duplicate key once two keys differ only in trailing
-- spaces. Tokens rewritten to their digest stay so.
ALTER TABLE outbox_parked MODIFY msg_key VARCHAR(191) NOT NULL, ALGORITHM = INSTANT;
ALTER TABLE outbox MODIFY msg_key VARCHAR(191) NOT NULL, ALGORITHM = INSTANT;
ALTER TABLE inbox
    MODIFY dedup_key VARCHAR(191) NOT NULL,
    MODIFY biz_type  VARCHAR(64)  NOT NULL,
    ALGORITHM = NOCOPY, LOCK = NONE;

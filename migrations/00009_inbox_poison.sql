-- +goose Up
-- A quarantined record is stored whatever its bytes, as inbox/quarantine.go does it.
--   tombstone     The Kafka record had no value, and payload is then empty.
--   payload_size  The original size in bytes, set only when payload holds less than the
--                 value. The fingerprint is then the sha256 of the whole value. A value over
--                 inbox.max_payload_bytes keeps a bounded prefix. A minimal row keeps none.
--                 It holds the key, source, reason and hash, and is written when the
--                 database refused the full row.
-- Both columns are added in place without copying the table, with ALGORITHM=INSTANT. The
-- columns of existing rows read as their defaults.
ALTER TABLE inbox
    ADD COLUMN tombstone    BOOLEAN      NOT NULL DEFAULT FALSE COMMENT 'the record had no value (payload stored empty)',
    ADD COLUMN payload_size INT UNSIGNED NULL COMMENT 'original size when payload holds only a prefix of it',
    ALGORITHM = INSTANT;

-- +goose Down
ALTER TABLE inbox
    DROP COLUMN payload_size,
    DROP COLUMN tombstone;

-- +goose Up
-- A quarantined record is stored whatever its bytes (inbox/quarantine.go):
--   tombstone     the Kafka record had no value (null); payload is then empty
--   payload_size  set only when payload holds less than the value: the original size in
--                 bytes, the fingerprint being the sha256 of the whole value. A value over
--                 inbox.max_payload_bytes keeps a bounded prefix; a minimal row (key,
--                 source, reason, hash), written when the database refused the full one,
--                 keeps none
-- Both are added in place without copying the table (ALGORITHM=INSTANT); the columns of
-- existing rows read as their defaults.
ALTER TABLE inbox
    ADD COLUMN tombstone    BOOLEAN      NOT NULL DEFAULT FALSE COMMENT 'the record had no value (payload stored empty)',
    ADD COLUMN payload_size INT UNSIGNED NULL COMMENT 'original size when payload holds only a prefix of it',
    ALGORITHM = INSTANT;

-- +goose Down
ALTER TABLE inbox
    DROP COLUMN payload_size,
    DROP COLUMN tombstone;

-- +goose Up
-- Outbox shards (relay.shards, issue 3): the shard of a row is MOD(key_hash, shards), so all
-- events of one key (the aggregate id) are in one shard and keep their order. key_hash is a
-- virtual column (computed, not stored in the row) that only lives in idx_unpublished, after
-- (published_at, id): a shard's relay reads the unpublished part of that index in id order
-- and filters on the index entries alone. With one shard nothing reads it.
ALTER TABLE outbox
    ADD COLUMN key_hash INT UNSIGNED AS (CRC32(msg_key)) VIRTUAL AFTER msg_key,
    DROP KEY idx_unpublished,
    ADD KEY idx_unpublished (published_at, id, key_hash);

-- relay_member: the live relay processes of a shard group (relay.shard), each renewing its
-- row. A relay of a group with several shards owns the shards i for which the i mod n-th of
-- the n live members (ordered by owner) is itself, and takes them through their leases
-- (relay_lease). shards is the member's relay.shards: members that disagree refuse to run.
CREATE TABLE relay_member (
    grp        VARCHAR(64)       NOT NULL COMMENT 'relay.shard of the member',
    owner      VARCHAR(191)      NOT NULL,
    shards     SMALLINT UNSIGNED NOT NULL COMMENT 'relay.shards of the member',
    expires_at DATETIME(6)       NOT NULL,
    joined_at  DATETIME(6)       NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (grp, owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE relay_member;
ALTER TABLE outbox
    DROP KEY idx_unpublished,
    ADD KEY idx_unpublished (published_at, id),
    DROP COLUMN key_hash;

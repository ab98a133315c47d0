-- +goose Up
-- Outbox shards, set by relay.shards. The shard of a row is MOD(key_hash, shards). So all
-- events of one key, the aggregate id, are in one shard and keep their order. key_hash is a
-- virtual column, computed and not stored in the row. It lives only in idx_unpublished,
-- after published_at and id. A shard's relay reads the unpublished part of that index in id
-- order and filters on the index entries alone. With one shard nothing reads it.
ALTER TABLE outbox
    ADD COLUMN key_hash INT UNSIGNED AS (CRC32(msg_key)) VIRTUAL AFTER msg_key,
    DROP KEY idx_unpublished,
    ADD KEY idx_unpublished (published_at, id, key_hash);

-- relay_member lists the live relay processes of a shard group, set by relay.shard. Each
-- renews its row. Order the n live members by owner. A relay of a group with several shards
-- owns each shard i for which the i mod n-th member is itself. It takes these shards
-- through their leases in relay_lease. shards is the member's relay.shards. Members that
-- disagree refuse to run.
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

-- +goose Up
-- relay_lease says which relay instance publishes an outbox shard. The owner renews
-- expires_at in short transactions. Another instance takes the shard over once it has
-- expired. Kafka's transactional.id fencing is the backstop should two instances ever
-- overlap.
CREATE TABLE relay_lease (
    shard       VARCHAR(64)     NOT NULL,
    owner       VARCHAR(191)    NOT NULL,
    expires_at  DATETIME(6)     NOT NULL,
    acquired_at DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    takeovers   BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'owner changes so far',
    updated_at  DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (shard)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE relay_lease;

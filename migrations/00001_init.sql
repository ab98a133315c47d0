-- +goose Up
-- The framework's tables. A plugin's own tables are in the plugin's Migrations. `router
-- migrate` applies them after these, with a version table of their own. Databases migrated
-- when this file also created the coupon tables keep them, and the coupon plugin's
-- migrations adopt them.

-- inbox has one row per business key and biz type. The unique key is the dedup line of
-- defence.
CREATE TABLE inbox (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    dedup_key       VARCHAR(191)    NOT NULL,
    biz_type        VARCHAR(64)     NOT NULL,
    status          ENUM('processing','done','failed') NOT NULL,
    reason          VARCHAR(32)     NULL COMMENT 'why failed: poison, conflict, retries_exhausted, permanent',
    message_uuid    VARCHAR(64)     NOT NULL,
    topic           VARCHAR(249)    NOT NULL,
    kafka_partition INT             NOT NULL,
    kafka_offset    BIGINT          NOT NULL,
    payload         MEDIUMBLOB      NOT NULL,
    metadata        TEXT            NULL COMMENT 'message metadata as JSON, kept for replay',
    fingerprint     CHAR(64)        NOT NULL,
    attempts        INT             NOT NULL DEFAULT 0,
    duplicates      INT             NOT NULL DEFAULT 0 COMMENT 'deliveries blocked as duplicates',
    last_error      TEXT            NULL,
    replay_id       BIGINT UNSIGNED NULL,
    created_at      DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    expire_at       DATETIME(6)     NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_dedup (dedup_key, biz_type),
    KEY idx_biz_status (biz_type, status, updated_at),
    KEY idx_expire (expire_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- outbox holds events written in the business transaction, which the relay forwards to
-- Kafka.
CREATE TABLE outbox (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    event_id     CHAR(36)     NOT NULL,
    event_type   VARCHAR(64)  NOT NULL,
    topic        VARCHAR(249) NOT NULL,
    msg_key      VARCHAR(191) NOT NULL,
    payload      MEDIUMBLOB   NOT NULL,
    headers      TEXT         NULL COMMENT 'JSON object of extra Kafka headers',
    created_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    published_at DATETIME(6)  NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_event (event_id),
    KEY idx_unpublished (published_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE outbox;
DROP TABLE inbox;

-- +goose Up
-- inbox: one row per (business key, biz type). The unique key is the dedup line of defence.
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

-- coupon_grant: the state machine, one row per (order, campaign).
CREATE TABLE coupon_grant (
    order_id    VARCHAR(64) NOT NULL,
    campaign_id VARCHAR(64) NOT NULL,
    user_id     VARCHAR(64) NOT NULL,
    state       ENUM('INIT','LOCKED','BUDGET_DEDUCTED','GRANTED','FAILED') NOT NULL,
    version     INT         NOT NULL DEFAULT 0,
    value_cents BIGINT      NOT NULL,
    coupon_id   CHAR(36)    NULL,
    reason      VARCHAR(64) NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (order_id, campaign_id),
    KEY idx_state (campaign_id, state)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- coupon_grant_log: every committed transition, written in the transition's own transaction.
CREATE TABLE coupon_grant_log (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    order_id    VARCHAR(64) NOT NULL,
    campaign_id VARCHAR(64) NOT NULL,
    from_state  VARCHAR(16) NOT NULL,
    to_state    VARCHAR(16) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    KEY idx_order (order_id, campaign_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE coupon_stock (
    campaign_id VARCHAR(64) NOT NULL,
    total       BIGINT      NOT NULL,
    locked      BIGINT      NOT NULL DEFAULT 0,
    granted     BIGINT      NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign_id),
    CONSTRAINT chk_stock CHECK (locked >= 0 AND granted >= 0 AND locked + granted <= total)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE coupon_budget (
    campaign_id VARCHAR(64) NOT NULL,
    total_cents BIGINT      NOT NULL,
    spent_cents BIGINT      NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign_id),
    CONSTRAINT chk_budget CHECK (spent_cents >= 0 AND spent_cents <= total_cents)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- user_coupon: the user's wallet. At most one coupon per (order, campaign).
CREATE TABLE user_coupon (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    coupon_id   CHAR(36)    NOT NULL,
    order_id    VARCHAR(64) NOT NULL,
    campaign_id VARCHAR(64) NOT NULL,
    user_id     VARCHAR(64) NOT NULL,
    value_cents BIGINT      NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_coupon (coupon_id),
    UNIQUE KEY uk_order_campaign (order_id, campaign_id),
    KEY idx_user (user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- outbox: events written in the business transaction, forwarded to Kafka by the relay.
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
DROP TABLE user_coupon;
DROP TABLE coupon_budget;
DROP TABLE coupon_stock;
DROP TABLE coupon_grant_log;
DROP TABLE coupon_grant;
DROP TABLE inbox;

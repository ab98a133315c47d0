-- +goose Up
-- The coupon notifier's table (version table goose_db_version_coupon_notifier). IF NOT
-- EXISTS adopts the table of databases migrated when the framework's version 2 created it.

-- notification: one notification per granted coupon. The unique key repeats the inbox's
-- dedup key as a second line of defence.
CREATE TABLE IF NOT EXISTS notification (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    order_id    VARCHAR(64)     NOT NULL,
    channel     VARCHAR(32)     NOT NULL,
    user_id     VARCHAR(64)     NOT NULL,
    coupon_id   CHAR(36)        NOT NULL,
    campaign_id VARCHAR(64)     NOT NULL,
    value_cents BIGINT          NOT NULL,
    event_id    CHAR(36)        NOT NULL,
    message     VARCHAR(255)    NOT NULL,
    created_at  DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_order_channel (order_id, channel),
    KEY idx_coupon (coupon_id),
    KEY idx_user (user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE notification;

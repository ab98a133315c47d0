-- +goose Up
-- replay: one row per `router replay` / `router inbox retry` run (dry runs included, with
-- dry_run = 1). The inbox rows a replay re-ran carry its id in inbox.replay_id.
CREATE TABLE replay (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    biz_type    VARCHAR(64)     NOT NULL,
    filter      TEXT            NOT NULL COMMENT 'the selection as JSON',
    dry_run     TINYINT(1)      NOT NULL DEFAULT 0,
    started_at  DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    finished_at DATETIME(6)     NULL,
    selected    INT             NOT NULL DEFAULT 0,
    processed   INT             NOT NULL DEFAULT 0,
    duplicate   INT             NOT NULL DEFAULT 0,
    quarantined INT             NOT NULL DEFAULT 0,
    conflict    INT             NOT NULL DEFAULT 0,
    outcome     VARCHAR(16)     NOT NULL DEFAULT 'running' COMMENT 'running, ok, partial, interrupted, dry_run',
    error       TEXT            NULL,
    PRIMARY KEY (id),
    KEY idx_started (started_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Replay and `router inbox ls` select by biz type and receive time, and by replay id.
ALTER TABLE inbox ADD KEY idx_biz_created (biz_type, created_at), ADD KEY idx_replay (replay_id);

-- notification: the coupon-notifier plugin (biz type notify) records one notification per
-- granted coupon. The unique key repeats the inbox's dedup key as a second line of defence.
CREATE TABLE notification (
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
ALTER TABLE inbox DROP KEY idx_replay, DROP KEY idx_biz_created;
DROP TABLE replay;

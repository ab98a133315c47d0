-- +goose Up
-- replay has one row per run of `router replay` or `router inbox retry`. Dry runs are
-- included, with dry_run = 1. The inbox rows a replay re-ran carry its id in
-- inbox.replay_id.
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

-- +goose Down
ALTER TABLE inbox DROP KEY idx_replay, DROP KEY idx_biz_created;
DROP TABLE replay;

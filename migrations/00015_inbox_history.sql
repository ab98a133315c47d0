-- +goose Up
-- Deliveries per minute, biz type and outcome, as the routers observed them. The outcomes
-- are processed, duplicate, held, quarantined and conflict. Each router adds its own counts
-- every few seconds, by INSERT … ON DUPLICATE KEY UPDATE n = n + VALUES(n). So the
-- console's chart and its last hour survive a restart and read the same on every router. A
-- minute is a few rows per biz type. So the console's hour is a range of the primary key,
-- not a count over the inbox. The routers delete rows older than 7 days.
CREATE TABLE inbox_history (
    biz_type VARCHAR(64) NOT NULL,
    minute   DATETIME    NOT NULL COMMENT 'UTC, truncated to the minute',
    outcome  VARCHAR(16) NOT NULL,
    n        BIGINT      NOT NULL,
    PRIMARY KEY (biz_type, minute, outcome)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE inbox_history;

-- +goose Up
-- Deliveries per minute, biz type and outcome (processed, duplicate, held, quarantined,
-- conflict), as the routers observed them: each router adds its own counts every few
-- seconds (INSERT … ON DUPLICATE KEY UPDATE n = n + VALUES(n)), so the console's chart and
-- its last hour survive a restart and read the same on every router. A minute is a few rows
-- per biz type: the console's hour is a range of the primary key, not a count over the inbox.
-- The routers delete rows older than 7 days.
CREATE TABLE inbox_history (
    biz_type VARCHAR(64) NOT NULL,
    minute   DATETIME    NOT NULL COMMENT 'UTC, truncated to the minute',
    outcome  VARCHAR(16) NOT NULL,
    n        BIGINT      NOT NULL,
    PRIMARY KEY (biz_type, minute, outcome)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE inbox_history;

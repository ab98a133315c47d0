-- +goose Up
-- Deliveries per minute, biz type and outcome, as the routers observed them. Each router
-- adds its own counts every few seconds, by ON CONFLICT … DO UPDATE SET n = inbox_history.n
-- + EXCLUDED.n. The console's chart and last hour read a range of the primary key. The
-- routers delete rows older than 7 days. See ../00015_inbox_history.sql.
CREATE TABLE inbox_history (
    biz_type VARCHAR(64) NOT NULL,
    minute   TIMESTAMPTZ NOT NULL,
    outcome  VARCHAR(16) NOT NULL,
    n        BIGINT      NOT NULL,
    PRIMARY KEY (biz_type, minute, outcome)
);

-- +goose Down
DROP TABLE inbox_history;

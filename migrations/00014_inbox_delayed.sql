-- +goose Up
-- Delayed redelivery (inbox.delayed_retries): a delivery whose immediate attempts ran out
-- with a retryable failure is kept 'failed' with reason 'delayed' until retry_at, when the
-- router's redeliverer runs it again from its stored payload; delayed_rounds counts the
-- rounds it had. Both are added in place without copying the table (ALGORITHM=INSTANT).
-- The redeliverer finds due rows in the (biz_type, 'failed') range of idx_biz_status_created:
-- no index of their own, so a delivery still updates one secondary index.
ALTER TABLE inbox
    ADD COLUMN retry_at       DATETIME(6) NULL COMMENT 'reason delayed: when the redeliverer runs the row again',
    ADD COLUMN delayed_rounds INT         NOT NULL DEFAULT 0 COMMENT 'delayed redeliveries had',
    ALGORITHM = INSTANT;

-- +goose Down
ALTER TABLE inbox
    DROP COLUMN delayed_rounds,
    DROP COLUMN retry_at;

-- +goose Up
-- Delayed redelivery, set by inbox.delayed_retries. A delivery may run out of immediate
-- attempts with a retryable failure. It is then kept 'failed' with reason 'delayed' until
-- retry_at. The router's redeliverer then runs it again from its stored payload.
-- delayed_rounds counts the rounds it had. Both columns are added in place without copying
-- the table, with ALGORITHM=INSTANT. The redeliverer finds due rows in the range of biz_type
-- and 'failed' in idx_biz_status_created. They have no index of their own, so a delivery
-- still updates one secondary index.
ALTER TABLE inbox
    ADD COLUMN retry_at       DATETIME(6) NULL COMMENT 'reason delayed: when the redeliverer runs the row again',
    ADD COLUMN delayed_rounds INT         NOT NULL DEFAULT 0 COMMENT 'delayed redeliveries had',
    ALGORITHM = INSTANT;

-- +goose Down
ALTER TABLE inbox
    DROP COLUMN delayed_rounds,
    DROP COLUMN retry_at;

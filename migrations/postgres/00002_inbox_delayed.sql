-- +goose Up
-- Delayed redelivery, set by inbox.delayed_retries. A delivery may run out of immediate
-- attempts with a retryable failure. It is then kept 'failed' with reason 'delayed' until
-- retry_at. The router's redeliverer then runs it again from its stored payload.
-- delayed_rounds counts the rounds it had. The redeliverer finds due rows in the range of
-- biz_type and 'failed' in idx_biz_status_created.
ALTER TABLE inbox
    ADD COLUMN retry_at       TIMESTAMP(6),
    ADD COLUMN delayed_rounds INTEGER NOT NULL DEFAULT 0;
COMMENT ON COLUMN inbox.retry_at IS 'reason delayed: when the redeliverer runs the row again';
COMMENT ON COLUMN inbox.delayed_rounds IS 'delayed redeliveries had';

-- +goose Down
ALTER TABLE inbox
    DROP COLUMN delayed_rounds,
    DROP COLUMN retry_at;

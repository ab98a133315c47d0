-- +goose Up
-- trace_parent: the W3C traceparent of the work that wrote the event (the handler's span, when
-- the router traces: otel.exporter), so the relay can write it as the published record's
-- traceparent header and a downstream consumer continues the same trace. NULL when the
-- writer was not traced: the relay then writes no such header. A version 00 traceparent is
-- 55 characters. outbox_parked keeps it too: a parked event moves between the two tables
-- with its columns (outbox.Parked), and goes out with its trace when it is retried. On
-- outbox this rebuilds the table and blocks writes to it while it does (LOCK=SHARED: the
-- indexed virtual column key_hash of 00005 rules out an instant or online change, checked
-- on MariaDB 10.11), as 00006 did: run it while the outbox is small (the relay's retention
-- keeps it so). On outbox_parked it is instant.
ALTER TABLE outbox ADD COLUMN trace_parent VARCHAR(55) NULL COMMENT 'W3C traceparent of the writing transaction';
ALTER TABLE outbox_parked ADD COLUMN trace_parent VARCHAR(55) NULL COMMENT 'W3C traceparent of the writing transaction';

-- +goose Down
ALTER TABLE outbox_parked DROP COLUMN trace_parent;
ALTER TABLE outbox DROP COLUMN trace_parent;

-- +goose Up
-- trace_parent is the W3C traceparent of the work that wrote the event. That is the
-- handler's span when the router traces, as otel.exporter sets. The relay writes it as the
-- published record's traceparent header, so a downstream consumer continues the same trace.
-- It is NULL when the writer was not traced, and the relay then writes no such header. A
-- version 00 traceparent is 55 characters. outbox_parked keeps it too. A parked event moves
-- between the two tables with its columns, by outbox.Parked, and goes out with its trace
-- when it is retried.
--
-- On outbox this rebuilds the table and blocks writes to it while it runs, with
-- LOCK=SHARED, as 00006 does. The indexed virtual column key_hash of 00005 rules out an
-- instant or online change on MariaDB 10.11. Run it while the outbox is small, as the
-- relay's retention keeps it. On outbox_parked the change is instant.
ALTER TABLE outbox ADD COLUMN trace_parent VARCHAR(55) NULL COMMENT 'W3C traceparent of the writing transaction';
ALTER TABLE outbox_parked ADD COLUMN trace_parent VARCHAR(55) NULL COMMENT 'W3C traceparent of the writing transaction';

-- +goose Down
ALTER TABLE outbox_parked DROP COLUMN trace_parent;
ALTER TABLE outbox DROP COLUMN trace_parent;

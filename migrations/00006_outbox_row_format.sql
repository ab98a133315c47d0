-- +goose Up
-- The relay marks every published row by setting published_at from NULL to a time. In
-- InnoDB's default DYNAMIC row format a NULL column takes no space. So that update grows the
-- row and is done as a delete and re-insert of the clustered record. In REDUNDANT format a
-- NULL fixed-size column keeps its space, 8 bytes for DATETIME(6). The mark then updates
-- the row in place. The relay's mark is its largest database cost. See docs/BENCHMARKS.md,
-- section "The relay marks by id range".
--
-- This rebuilds the table. Because of the indexed virtual column key_hash of 00005, it
-- blocks writes to the table while it runs, with LOCK=SHARED. Run it while the outbox is
-- small, as the relay's retention keeps it.
ALTER TABLE outbox ROW_FORMAT = REDUNDANT;

-- +goose Down
ALTER TABLE outbox ROW_FORMAT = DYNAMIC;

-- +goose Up
-- The relay marks every published row (published_at NULL → a time). In InnoDB's default
-- DYNAMIC row format a NULL column takes no space, so that update grows the row and is done
-- as a delete and re-insert of the clustered record; in REDUNDANT format a NULL fixed-size
-- column (DATETIME(6): 8 bytes) keeps its space, and the mark updates the row in place.
-- Measured on MariaDB 10.11 here, 100,000 rows marked 2,000 per statement: ≈25,000 rows/s
-- DYNAMIC, ≈44,000 rows/s REDUNDANT; inserts within a few percent. The relay's mark is its
-- largest database cost. This rebuilds the table and, because of the indexed virtual column
-- key_hash (00005), blocks writes to it while it does (LOCK=SHARED): run it while the outbox
-- is small (the relay's retention keeps it so).
ALTER TABLE outbox ROW_FORMAT = REDUNDANT;

-- +goose Down
ALTER TABLE outbox ROW_FORMAT = DYNAMIC;

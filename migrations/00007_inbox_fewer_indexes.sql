-- +goose Up
-- Every delivery inserts an inbox row, and each secondary index is one more B-tree insert
-- per row. Two of the four secondary indexes of 00001 and 00002 go. See docs/BENCHMARKS.md,
-- section "One inbox index".
--
-- 1. The cleaner's idx_expire on expire_at and the operator's idx_biz_status on biz_type,
--    status and updated_at become one index on biz_type, status and expire_at. The cleaner
--    deletes per biz type the 'done' rows whose expire_at passed, which is a range of this
--    index. `--older-than` filters on updated_at within a range of biz type and status. It
--    is meant for 'processing' and 'failed' rows, which are few. A delivery counted as a
--    duplicate changes updated_at and not expire_at, so it moves no index entry either.
-- 2. idx_replay on replay_id goes. Replays list the rows they stamp in replay_row, written
--    in the stamp's own transaction. Only replays stamp rows. `--replay-id N` reads
--    replay_row, then keeps the rows whose replay_id is still N, since a later replay
--    stamps them again.
CREATE TABLE replay_row (
    replay_id BIGINT UNSIGNED NOT NULL,
    inbox_id  BIGINT UNSIGNED NOT NULL COMMENT 'id in the inbox table the replay ran on',
    PRIMARY KEY (replay_id, inbox_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO replay_row (replay_id, inbox_id) SELECT replay_id, id FROM inbox WHERE replay_id IS NOT NULL;

ALTER TABLE inbox
    DROP KEY idx_replay,
    DROP KEY idx_expire,
    DROP KEY idx_biz_status,
    ADD KEY idx_biz_status_expire (biz_type, status, expire_at);

-- +goose Down
ALTER TABLE inbox
    DROP KEY idx_biz_status_expire,
    ADD KEY idx_biz_status (biz_type, status, updated_at),
    ADD KEY idx_expire (expire_at),
    ADD KEY idx_replay (replay_id);
DROP TABLE replay_row;

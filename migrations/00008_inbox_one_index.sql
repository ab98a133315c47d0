-- +goose Up
-- One secondary index serves the cleaner and the reads by status and receive time. 00007
-- left two. idx_biz_status_expire on biz_type, status and expire_at is the cleaner's and the
-- operator's. idx_biz_created on biz_type and created_at serves replay and `inbox ls` by
-- --since and --until. Every delivery inserts an inbox row, so each index is a B-tree insert
-- per delivery. One index on biz_type, status and created_at serves all three uses.
--
-- - The cleaner reads the oldest 'done' rows of a biz type in created_at order. It deletes
--   those whose expire_at passed and stops at the first that has not. expire_at is
--   created_at + inbox.retention, so receive order is expiry order. See inbox/cleaner.go.
-- - A time range with statuses is a range per status. Without statuses the query in
--   inbox/store.go names all three, so it is still three ranges and not a scan.
-- - --older-than filters on updated_at within a range of biz type and status, as with 00007.
--
-- created_at never changes after the insert. A delivery counted as a duplicate sets
-- updated_at, so it still moves no index entry. See docs/BENCHMARKS.md, section "One inbox
-- index".
--
-- The index is built in place while the inbox stays readable and writable. With LOCK=NONE
-- the statement fails rather than block the consumers, should the server be unable to
-- build it so.
ALTER TABLE inbox
    DROP KEY idx_biz_status_expire,
    DROP KEY idx_biz_created,
    ADD KEY idx_biz_status_created (biz_type, status, created_at),
    ALGORITHM = INPLACE, LOCK = NONE;

-- +goose Down
ALTER TABLE inbox
    DROP KEY idx_biz_status_created,
    ADD KEY idx_biz_status_expire (biz_type, status, expire_at),
    ADD KEY idx_biz_created (biz_type, created_at),
    ALGORITHM = INPLACE, LOCK = NONE;

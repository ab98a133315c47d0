-- +goose Up
-- inbox_call holds a key's call lease. Before a plugin's Prepare makes outside calls for a
-- key, the path that runs it takes the key's row here. That path may be a partition's
-- delivery, a duplicate, the delayed redeliverer, a replay, a console retry or another
-- router. One inbox instance owns the row at a time. The transaction that finishes the key
-- deletes the row. The owner renews expires_at while it holds the row. Another instance
-- takes an expired row over. The keys compare exactly in utf8mb4_nopad_bin, as the inbox's
-- do, because the lease read joins them.
CREATE TABLE inbox_call (
    biz_type    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    dedup_key   VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    owner       VARCHAR(64)  NOT NULL COMMENT 'host/pid/random of the inbox instance',
    expires_at  DATETIME(6)  NOT NULL,
    acquired_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (biz_type, dedup_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE inbox_call;

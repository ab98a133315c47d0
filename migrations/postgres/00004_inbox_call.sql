-- +goose Up
-- inbox_call holds a key's call lease. Before a plugin's Prepare makes outside calls for a
-- key, the path that runs it takes the key's row here. That path may be a partition's
-- delivery, a duplicate, the delayed redeliverer, a replay, a console retry or another
-- router. One inbox instance owns the row at a time. The transaction that finishes the key
-- deletes the row. The owner renews expires_at while it holds the row. Another instance
-- takes an expired row over.
CREATE TABLE inbox_call (
    biz_type    VARCHAR(64)  NOT NULL,
    dedup_key   VARCHAR(191) NOT NULL,
    owner       VARCHAR(64)  NOT NULL,
    expires_at  TIMESTAMP(6) NOT NULL,
    acquired_at TIMESTAMP(6) NOT NULL DEFAULT LOCALTIMESTAMP,
    PRIMARY KEY (biz_type, dedup_key)
);
COMMENT ON COLUMN inbox_call.owner IS 'host/pid/random of the inbox instance';

-- +goose Down
DROP TABLE inbox_call;

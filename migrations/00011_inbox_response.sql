-- +goose Up
-- inbox_response holds the response of an HTTP command, an inbox.Command. It has one row
-- per inbox row of a command's biz type, written in the transaction that made the row
-- 'done'. A retry with the same Idempotency-Key gets it back instead of a second effect.
-- The inbox cleaner deletes it with its row.
CREATE TABLE inbox_response (
    inbox_id    BIGINT UNSIGNED NOT NULL,
    status      SMALLINT     NOT NULL COMMENT 'HTTP status',
    body        BLOB         NULL COMMENT 'JSON body, at most 64 KiB',
    created_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (inbox_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE inbox_response;

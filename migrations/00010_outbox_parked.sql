-- +goose Up
-- outbox_parked: outbox events Kafka refuses for good (the topic does not exist, the record
-- is too large or invalid, writing to the topic is not authorized), moved out of outbox by
-- the relay with the error, so other keys and topics keep flowing; and the later events of
-- their keys, held behind them so the key's order holds (held_behind names the parked
-- event they wait behind; NULL for the parked event itself). A row keeps its outbox id, so
-- `router outbox retry` puts it (and the events held behind it) back in its place in id
-- order. The relay reads the whole table every batch: it stays small, as only refused
-- events and their keys' followers are here. The hot outbox table and its index are
-- unchanged.
CREATE TABLE outbox_parked (
    id          BIGINT UNSIGNED NOT NULL COMMENT 'the id the row had (and gets back) in outbox',
    event_id    CHAR(36)     NOT NULL,
    event_type  VARCHAR(64)  NOT NULL,
    topic       VARCHAR(249) NOT NULL,
    msg_key     VARCHAR(191) NOT NULL,
    payload     MEDIUMBLOB   NOT NULL,
    headers     TEXT         NULL COMMENT 'JSON object of extra Kafka headers',
    created_at  DATETIME(6)  NOT NULL COMMENT 'when the event was written to outbox',
    reason      VARCHAR(32)  NOT NULL COMMENT 'unknown_topic, too_large, invalid_record, unauthorized, held',
    error       TEXT         NOT NULL COMMENT 'Kafka''s (or the client''s) error, naming topic, key and event',
    held_behind CHAR(36)     NULL COMMENT 'event id of the parked event this one waits behind; NULL: parked itself',
    parked_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_event (event_id),
    KEY idx_held_behind (held_behind)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE outbox_parked;

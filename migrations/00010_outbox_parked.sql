-- +goose Up
-- outbox_parked holds the outbox events that Kafka refuses for good. The topic may not
-- exist, the record may be too large or invalid, or writing to the topic may not be
-- authorized. The relay moves such events out of outbox with the error, so other keys and
-- topics keep flowing. It also moves the later events of their keys, held behind them, so
-- the key's order holds. held_behind names the parked event they wait behind, and is NULL
-- for the parked event itself.
--
-- A row keeps its outbox id. So `router outbox retry` puts it back in its place in id
-- order, with the events held behind it. The relay reads the whole table every batch. It
-- stays small, as only refused events and the later events of their keys are here. The hot
-- outbox table and its index are unchanged.
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

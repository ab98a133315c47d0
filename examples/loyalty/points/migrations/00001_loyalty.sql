-- +goose Up
-- points_credit: one row per shipped order credited. The unique order id repeats the inbox's
-- dedup key as a second line of defence. Ids compare exactly, as the inbox's keys do:
-- utf8mb4_nopad_bin (utf8mb4_bin would take 'o-1 ' for 'o-1').
CREATE TABLE points_credit (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    order_id   VARCHAR(64)     NOT NULL,
    user_id    VARCHAR(64)     NOT NULL,
    points     INT             NOT NULL,
    created_at DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_order (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- points_balance: the user's balance, the sum of their credits.
CREATE TABLE points_balance (
    user_id VARCHAR(64) NOT NULL,
    points  BIGINT      NOT NULL,
    PRIMARY KEY (user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- +goose Down
DROP TABLE points_balance;
DROP TABLE points_credit;

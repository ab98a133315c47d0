-- +goose Up
-- The coupon granter's tables (version table goose_db_version_coupon_granter). IF NOT EXISTS
-- adopts the tables of databases migrated when the framework's own migrations created them
-- (its versions 1 and 4): there they are already in this shape, and are kept with their rows.

-- coupon_grant: the state machine, one row per (order, campaign). stock_shard and
-- budget_shard are the counter shards the grant used, so a release or consume touches the
-- same rows.
CREATE TABLE IF NOT EXISTS coupon_grant (
    order_id     VARCHAR(64) NOT NULL,
    campaign_id  VARCHAR(64) NOT NULL,
    user_id      VARCHAR(64) NOT NULL,
    state        ENUM('INIT','LOCKED','BUDGET_DEDUCTED','GRANTED','FAILED') NOT NULL,
    version      INT         NOT NULL DEFAULT 0,
    value_cents  BIGINT      NOT NULL,
    stock_shard  SMALLINT    NULL,
    budget_shard SMALLINT    NULL,
    coupon_id    CHAR(36)    NULL,
    reason       VARCHAR(64) NULL,
    created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (order_id, campaign_id),
    KEY idx_state (campaign_id, state)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- coupon_grant_log: every committed transition, written in the transition's own transaction.
CREATE TABLE IF NOT EXISTS coupon_grant_log (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    order_id    VARCHAR(64) NOT NULL,
    campaign_id VARCHAR(64) NOT NULL,
    from_state  VARCHAR(16) NOT NULL,
    to_state    VARCHAR(16) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    KEY idx_order (order_id, campaign_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Stock and budget counters, split into shards per campaign: every grant step updates one
-- shard's row and holds its lock until commit, so the shards are how many grants of a
-- campaign commit at once.
CREATE TABLE IF NOT EXISTS coupon_stock (
    campaign_id VARCHAR(64) NOT NULL,
    shard       SMALLINT    NOT NULL DEFAULT 0,
    total       BIGINT      NOT NULL,
    locked      BIGINT      NOT NULL DEFAULT 0,
    granted     BIGINT      NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign_id, shard),
    CONSTRAINT chk_stock CHECK (locked >= 0 AND granted >= 0 AND locked + granted <= total)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS coupon_budget (
    campaign_id VARCHAR(64) NOT NULL,
    shard       SMALLINT    NOT NULL DEFAULT 0,
    total_cents BIGINT      NOT NULL,
    spent_cents BIGINT      NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign_id, shard),
    CONSTRAINT chk_budget CHECK (spent_cents >= 0 AND spent_cents <= total_cents)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- user_coupon: the user's wallet. At most one coupon per (order, campaign).
CREATE TABLE IF NOT EXISTS user_coupon (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    coupon_id   CHAR(36)    NOT NULL,
    order_id    VARCHAR(64) NOT NULL,
    campaign_id VARCHAR(64) NOT NULL,
    user_id     VARCHAR(64) NOT NULL,
    value_cents BIGINT      NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_coupon (coupon_id),
    UNIQUE KEY uk_order_campaign (order_id, campaign_id),
    KEY idx_user (user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A database whose framework migrations stopped before version 4 has the counters without
-- shards: the same change version 4 made, a no-op for the columns that exist. The primary
-- keys are rebuilt in any case (one row per campaign shard: a few rows).
ALTER TABLE coupon_grant
    ADD COLUMN IF NOT EXISTS stock_shard SMALLINT NULL AFTER value_cents,
    ADD COLUMN IF NOT EXISTS budget_shard SMALLINT NULL AFTER stock_shard;
ALTER TABLE coupon_stock
    ADD COLUMN IF NOT EXISTS shard SMALLINT NOT NULL DEFAULT 0 AFTER campaign_id,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (campaign_id, shard);
ALTER TABLE coupon_budget
    ADD COLUMN IF NOT EXISTS shard SMALLINT NOT NULL DEFAULT 0 AFTER campaign_id,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (campaign_id, shard);

-- +goose Down
DROP TABLE user_coupon;
DROP TABLE coupon_budget;
DROP TABLE coupon_stock;
DROP TABLE coupon_grant_log;
DROP TABLE coupon_grant;

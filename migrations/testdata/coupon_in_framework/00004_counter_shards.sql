-- +goose Up
-- Stock and budget counters are split into shards per campaign: every grant step used to
-- update the campaign's single counter row and hold its lock until commit, which capped all
-- grants of a campaign at one commit at a time. Each grant records the shard it used so a
-- release or consume touches the same row.
ALTER TABLE coupon_stock
    ADD COLUMN shard SMALLINT NOT NULL DEFAULT 0 AFTER campaign_id,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (campaign_id, shard);
ALTER TABLE coupon_budget
    ADD COLUMN shard SMALLINT NOT NULL DEFAULT 0 AFTER campaign_id,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (campaign_id, shard);
ALTER TABLE coupon_grant
    ADD COLUMN stock_shard SMALLINT NULL AFTER value_cents,
    ADD COLUMN budget_shard SMALLINT NULL AFTER stock_shard;

-- +goose Down
ALTER TABLE coupon_grant DROP COLUMN budget_shard, DROP COLUMN stock_shard;
DELETE FROM coupon_budget WHERE shard <> 0;
ALTER TABLE coupon_budget DROP PRIMARY KEY, DROP COLUMN shard, ADD PRIMARY KEY (campaign_id);
DELETE FROM coupon_stock WHERE shard <> 0;
ALTER TABLE coupon_stock DROP PRIMARY KEY, DROP COLUMN shard, ADD PRIMARY KEY (campaign_id);

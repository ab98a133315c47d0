-- +goose Up
-- Version 4 sharded the coupon plugin's stock and budget counters. The coupon tables now
-- belong to the coupon plugin, in coupon/migrations. They are created there in their sharded
-- shape, and adopted where this version already changed them. So nothing is left to do
-- here. The version stays, so that the numbers of databases migrated before keep their
-- meaning.
SELECT 1;

-- +goose Down
SELECT 1;

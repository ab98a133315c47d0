-- +goose Up
-- Keys compare exactly: order, campaign and user ids in utf8mb4_nopad_bin. The tables'
-- utf8mb4_bin is PAD SPACE, which compares 'o-1 ' equal to 'o-1': a second order whose id
-- differs only in trailing spaces was taken for the first one's grant (no coupon of its
-- own), and a user's wallet listed another's coupons. NO PAD tells more ids apart, never
-- fewer, so no existing rows collide.
--
-- A column of a primary key cannot change its collation in place on MariaDB 10.11 (checked:
-- "Cannot change column type. Try ALGORITHM=COPY"): coupon_grant, coupon_stock and
-- coupon_budget are copied, readable but not writable meanwhile (LOCK=SHARED) — grants wait
-- for it, for as long as copying coupon_grant takes (one row per order): run it with the
-- routers stopped or in a quiet hour. The other two change their indexes in place, readable
-- and writable (NOCOPY, LOCK=NONE).
ALTER TABLE coupon_grant
    MODIFY order_id    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY campaign_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY user_id     VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = COPY, LOCK = SHARED;
ALTER TABLE coupon_grant_log
    MODIFY order_id    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY campaign_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = NOCOPY, LOCK = NONE;
ALTER TABLE coupon_stock
    MODIFY campaign_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = COPY, LOCK = SHARED;
ALTER TABLE coupon_budget
    MODIFY campaign_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = COPY, LOCK = SHARED;
ALTER TABLE user_coupon
    MODIFY order_id    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY campaign_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY user_id     VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = NOCOPY, LOCK = NONE;

-- +goose Down
-- Back to PAD SPACE; fails (duplicate key) once two ids differ only in trailing spaces.
ALTER TABLE user_coupon
    MODIFY order_id    VARCHAR(64) NOT NULL,
    MODIFY campaign_id VARCHAR(64) NOT NULL,
    MODIFY user_id     VARCHAR(64) NOT NULL;
ALTER TABLE coupon_budget MODIFY campaign_id VARCHAR(64) NOT NULL;
ALTER TABLE coupon_stock MODIFY campaign_id VARCHAR(64) NOT NULL;
ALTER TABLE coupon_grant_log
    MODIFY order_id    VARCHAR(64) NOT NULL,
    MODIFY campaign_id VARCHAR(64) NOT NULL;
ALTER TABLE coupon_grant
    MODIFY order_id    VARCHAR(64) NOT NULL,
    MODIFY campaign_id VARCHAR(64) NOT NULL,
    MODIFY user_id     VARCHAR(64) NOT NULL;

-- +goose Up
-- Keys compare exactly: order, user and campaign ids and the channel in utf8mb4_nopad_bin.
-- The table's utf8mb4_bin is PAD SPACE, which compares 'o-1 ' equal to 'o-1': the
-- notification of an order whose id differs from another's only in trailing spaces was
-- taken for the other's (uk_order_channel) and never sent. NO PAD tells more ids apart,
-- never fewer, so no existing rows collide; the indexes change in place while the table
-- stays readable and writable (NOCOPY, LOCK=NONE).
ALTER TABLE notification
    MODIFY order_id    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY channel     VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY user_id     VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    MODIFY campaign_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    ALGORITHM = NOCOPY, LOCK = NONE;

-- +goose Down
-- Back to PAD SPACE; fails (duplicate key) once two ids differ only in trailing spaces.
ALTER TABLE notification
    MODIFY order_id    VARCHAR(64) NOT NULL,
    MODIFY channel     VARCHAR(32) NOT NULL,
    MODIFY user_id     VARCHAR(64) NOT NULL,
    MODIFY campaign_id VARCHAR(64) NOT NULL;

package migrations_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// Every migration rolls back (`router migrate --reset`, the bench's start) and applies again;
// 00007 lists the rows earlier replays stamped in replay_row, so --replay-id still finds them.
func TestMigrationsRollBackAndReapply(t *testing.T) {
	d := testenv.DB(t, 2) // migrated up
	ctx := context.Background()
	p, err := goose.NewProvider(goose.DialectMySQL, d.Admin, migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 6); err != nil {
		t.Fatalf("down to 6: %v", err)
	}
	d.AdminExec(t, `INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, replay_id, expire_at)
		VALUES ('o-1', 'coupon', 'done', 'x', 't', 0, 0, '', '', 5, NOW()), ('o-2', 'coupon', 'done', 'x', 't', 0, 1, '', '', NULL, NOW())`)
	if _, err := p.UpTo(ctx, 7); err != nil {
		t.Fatalf("up to 7: %v", err)
	}
	var key string
	if err := d.Admin.QueryRowContext(ctx, "SELECT i.dedup_key FROM replay_row r JOIN inbox i ON i.id = r.inbox_id WHERE r.replay_id = 5").Scan(&key); err != nil || key != "o-1" {
		t.Fatalf("replay_row after 00007: %q %v, want o-1", key, err)
	}
	if err := migrations.Reset(ctx, d.Admin); err != nil {
		t.Fatalf("reset: %v", err)
	}
	var tables int
	if err := d.Admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name <> 'goose_db_version'").Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("tables left after reset: %d %v", tables, err)
	}
	if err := migrations.Up(ctx, d.Admin); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// TestExactKeysMigration checks 00013. Inbox keys compare exactly. The HTTP listener's rows
// of client tokens that begin with "sha256:" get the key that engine.CommandKey gives such a
// token, so their retries still find them. At version 12, before 00013, a key with a
// trailing space is the same row as the key without, and the check below sees that.
func TestExactKeysMigration(t *testing.T) {
	d := testenv.DB(t, 2)
	ctx := context.Background()
	p, err := goose.NewProvider(goose.DialectMySQL, d.Admin, migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 12); err != nil {
		t.Fatalf("down to 12: %v", err)
	}
	insert := func(key, topic string, partition int) error {
		_, err := d.Admin.ExecContext(ctx, `INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
			VALUES (?, 'claim', 'done', 'x', ?, ?, -1, '', '', NOW())`, key, topic, partition)
		return err
	}
	const http = "http POST /v1/claims"
	digestLike := "sha256:" + strings.Repeat("0123456789abcdef", 4)
	for _, r := range []struct {
		key, topic string
		partition  int
	}{
		{"h1-g1", http, -1}, {"sha256:my-token", http, -1}, {digestLike, http, -1}, {"sha256:order-7", "orders", 0}, {"A", http, -1},
	} {
		if err := insert(r.key, r.topic, r.partition); err != nil {
			t.Fatal(err)
		}
	}
	if err := insert("h1-g1 ", http, -1); !dbx.IsDuplicate(err) {
		t.Fatalf("version 12, 'h1-g1 ' beside 'h1-g1': %v, want a duplicate key (PAD SPACE)", err)
	}
	if _, err := p.UpTo(ctx, 13); err != nil {
		t.Fatalf("up to 13: %v", err)
	}
	for _, k := range []string{"h1-g1 ", "h1-g1  ", "a"} {
		if err := insert(k, http, -1); err != nil {
			t.Errorf("version 13, %q beside its look-alike: %v", k, err)
		}
	}
	for key, want := range map[string]int{
		"h1-g1": 1, "h1-g1 ": 1, "h1-g1  ": 1, "A": 1, "a": 1,
		engine.CommandKey("sha256:my-token"): 1, "sha256:my-token": 0, // rewritten to the key the token has now
		digestLike:       1, // a long token's digest, or cannot be told from one: kept
		"sha256:order-7": 1, // a Kafka delivery's key: never a token's
	} {
		var n int
		if err := d.Admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM inbox WHERE dedup_key = ?", key).Scan(&n); err != nil || n != want {
			t.Errorf("rows of key %q: %d %v, want %d", key, n, err, want)
		}
	}
	if ddl := showCreate(t, d.Admin, "inbox"); !strings.Contains(ddl, "`dedup_key` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL") {
		t.Errorf("inbox after 00013:\n%s", ddl)
	}
}

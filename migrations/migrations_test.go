package migrations_test

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/coupon/notify"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
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
	if left := tables(t, d.Admin); len(left) != 0 {
		t.Fatalf("tables left after reset: %v", left)
	}
	if err := migrations.Up(ctx, d.Admin); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// The framework's migrations create no plugin table.
func TestFrameworkHasNoPluginTables(t *testing.T) {
	d := testenv.DB(t, 2)
	want := []string{"inbox", "inbox_response", "outbox", "outbox_parked", "relay_lease", "relay_member", "replay", "replay_row"}
	if got := tables(t, d.Admin); !slices.Equal(got, want) {
		t.Fatalf("tables of the framework's migrations: %v, want %v", got, want)
	}
}

// A plugin's migrations are applied after the framework's and recorded in a version table of
// their own; they roll back before the framework's (the plugin's table refers to inbox, so
// the other order would fail); names that cannot name a version table, or two that would
// share one, are refused.
func TestPluginMigrations(t *testing.T) {
	d := testenv.DB(t, 2)
	ctx := context.Background()
	widgets := migrations.Set{Name: "widget-maker", FS: fstest.MapFS{
		"00001_widget.sql": {Data: []byte(`-- +goose Up
CREATE TABLE widget (
    id       BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    inbox_id BIGINT UNSIGNED NOT NULL,
    CONSTRAINT fk_widget_inbox FOREIGN KEY (inbox_id) REFERENCES inbox (id)
) ENGINE = InnoDB;
-- +goose Down
DROP TABLE widget;
`)},
		"00002_widget_name.sql": {Data: []byte(`-- +goose Up
ALTER TABLE widget ADD COLUMN name VARCHAR(64) NOT NULL DEFAULT '';
-- +goose Down
ALTER TABLE widget DROP COLUMN name;
`)},
		"README.md": {Data: []byte("not a migration")},
	}}
	if got := widgets.Table(); got != "goose_db_version_widget_maker" {
		t.Fatalf("version table %q", got)
	}
	if err := migrations.Up(ctx, d.Admin, widgets); err != nil {
		t.Fatal(err)
	}
	if got := versions(t, d.Admin, "goose_db_version_widget_maker"); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("plugin versions %v, want [1 2]", got)
	}
	if got := versions(t, d.Admin, migrations.FrameworkTable); got[len(got)-1] < 10 || slices.Contains(got[1:], 1) {
		t.Fatalf("framework versions %v", got)
	}
	d.AdminExec(t, `INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
		VALUES ('k', 'w', 'done', 'x', 't', 0, 0, '', '', NOW())`)
	d.AdminExec(t, `INSERT INTO widget (inbox_id, name) SELECT id, 'w' FROM inbox`)
	st, err := migrations.Status(ctx, parseTime(t, d.Name), widgets)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(st, "\n")
	for _, w := range []string{"onceflow 00001 00001_init.sql applied", "widget-maker 00002 00002_widget_name.sql applied"} {
		if !strings.Contains(joined, w) {
			t.Errorf("status lacks %q:\n%s", w, joined)
		}
	}
	if err := migrations.Up(ctx, d.Admin, widgets); err != nil { // nothing pending
		t.Fatalf("up again: %v", err)
	}
	if err := migrations.Reset(ctx, d.Admin, widgets); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if left := tables(t, d.Admin); len(left) != 0 {
		t.Fatalf("tables left after reset: %v", left)
	}

	for _, tc := range []struct {
		name string
		sets []migrations.Set
		want string
	}{
		{"upper case", []migrations.Set{{Name: "Widgets", FS: widgets.FS}}, `"Widgets"`},
		{"too long", []migrations.Set{{Name: strings.Repeat("w", 48), FS: widgets.FS}}, "1..47"},
		{"no files", []migrations.Set{{Name: "w"}}, "no files"},
		{"shared version table", []migrations.Set{{Name: "a-b", FS: widgets.FS}, {Name: "a_b", FS: widgets.FS}}, "goose_db_version_a_b"},
	} {
		if err := migrations.Up(ctx, d.Admin, tc.sets...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}

// A database migrated when the framework's migrations still created the coupon and notifier
// tables keeps them, rows and all: the plugins' migrations adopt them, in the same shape as
// on a fresh database, and roll them back. Both from the last such version (10) and from a
// database whose framework migrations stopped before the counters were sharded (3).
func TestPluginMigrationsAdoptTables(t *testing.T) {
	plugins := []migrations.Set{{Name: coupon.PluginName, FS: coupon.Migrations}, {Name: notify.PluginName, FS: notify.Migrations}}
	pluginTables := []string{"coupon_budget", "coupon_grant", "coupon_grant_log", "coupon_stock", "notification", "user_coupon"}
	fresh := testenv.DB(t, 2, plugins...)
	want := map[string]string{}
	for _, tb := range pluginTables {
		want[tb] = showCreate(t, fresh.Admin, tb)
	}
	old := oldFramework(t)
	for _, v := range []int64{10, 3} {
		t.Run(map[int64]string{10: "from version 10", 3: "from version 3"}[v], func(t *testing.T) {
			d := testenv.DB(t, 2)
			ctx := context.Background()
			if err := migrations.Reset(ctx, d.Admin); err != nil {
				t.Fatal(err)
			}
			p, err := goose.NewProvider(goose.DialectMySQL, d.Admin, old)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.UpTo(ctx, v); err != nil {
				t.Fatalf("old framework migrations up to %d: %v", v, err)
			}
			d.AdminExec(t, `INSERT INTO coupon_stock (campaign_id, total) VALUES ('c1', 10)`)
			d.AdminExec(t, `INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES ('cp-1', 'o-1', 'c1', 'u1', 500)`)
			d.AdminExec(t, `INSERT INTO notification (order_id, channel, user_id, coupon_id, campaign_id, value_cents, event_id, message)
				VALUES ('o-1', 'wallet', 'u1', 'cp-1', 'c1', 500, 'e-1', 'hi')`)

			if err := migrations.Up(ctx, d.Admin, plugins...); err != nil {
				t.Fatalf("up with the plugins' migrations: %v", err)
			}
			for _, tb := range pluginTables {
				if got := showCreate(t, d.Admin, tb); got != want[tb] {
					t.Errorf("%s adopted as\n%s\nwant (fresh)\n%s", tb, got, want[tb])
				}
			}
			for _, q := range []string{"SELECT COUNT(*) FROM coupon_stock WHERE campaign_id = 'c1' AND shard = 0 AND total = 10",
				"SELECT COUNT(*) FROM user_coupon WHERE coupon_id = 'cp-1'", "SELECT COUNT(*) FROM notification WHERE order_id = 'o-1'"} {
				var n int
				if err := d.Admin.QueryRowContext(ctx, q).Scan(&n); err != nil || n != 1 {
					t.Errorf("%s: %d %v, want the row kept", q, n, err)
				}
			}
			for _, s := range plugins {
				if got := versions(t, d.Admin, s.Table()); !slices.Equal(got, []int64{1, 2}) {
					t.Errorf("%s versions %v, want [1 2]", s.Table(), got)
				}
			}
			if err := migrations.Reset(ctx, d.Admin, plugins...); err != nil {
				t.Fatalf("reset: %v", err)
			}
			if left := tables(t, d.Admin); len(left) != 0 {
				t.Fatalf("tables left after reset: %v", left)
			}
			if err := migrations.Up(ctx, d.Admin, plugins...); err != nil {
				t.Fatalf("up again: %v", err)
			}
		})
	}
}

// oldFramework is the framework's migrations with 00001, 00002 and 00004 as they were when
// they also created the plugins' tables (testdata/coupon_in_framework).
func oldFramework(t *testing.T) fs.FS {
	t.Helper()
	m := fstest.MapFS{}
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if v := e.Name()[:5]; v == "00001" || v == "00002" || v == "00004" {
			continue
		}
		b, err := fs.ReadFile(migrations.FS, e.Name())
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = &fstest.MapFile{Data: b}
	}
	for _, name := range []string{"00001_init.sql", "00002_replay_notify.sql", "00004_counter_shards.sql"} {
		b, err := os.ReadFile("testdata/coupon_in_framework/" + name)
		if err != nil {
			t.Fatal(err)
		}
		m[name] = &fstest.MapFile{Data: b}
	}
	return m
}

// parseTime is an admin pool on database name that scans DATETIME into time.Time, as
// goose's status needs (the router's pools do: pkg/dbx).
func parseTime(t *testing.T, name string) *sql.DB {
	t.Helper()
	mc, err := mysql.ParseDSN(testenv.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	mc.DBName, mc.ParseTime = name, true
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// tables lists the database's tables but goose's version tables, sorted.
func tables(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()
		AND table_name NOT LIKE 'goose\_db\_version%' ORDER BY table_name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// versions lists the applied versions recorded in a goose version table (0 is goose's own).
func versions(t *testing.T, db *sql.DB, table string) []int64 {
	t.Helper()
	rows, err := db.Query("SELECT version_id FROM " + table + " WHERE is_applied AND version_id > 0 ORDER BY version_id")
	if err != nil {
		t.Fatalf("%s: %v", table, err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

var autoIncrement = regexp.MustCompile(` AUTO_INCREMENT=\d+`)

func showCreate(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	var name, ddl string
	if err := db.QueryRow("SHOW CREATE TABLE "+table).Scan(&name, &ddl); err != nil {
		t.Fatalf("%s: %v", table, err)
	}
	return autoIncrement.ReplaceAllString(ddl, "")
}

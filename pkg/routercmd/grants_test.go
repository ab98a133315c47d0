package routercmd_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/coupon/notify"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

// grantedEcho is the echo plugin with its grants file. The echo handler only inserts.
func grantedEcho(in, out string) inbox.Plugin {
	p := echoPlugin(in, out)
	p.Migrations = fstest.MapFS{
		"00001_echo.sql":      p.Migrations.(fstest.MapFS)["00001_echo.sql"],
		migrations.GrantsFile: {Data: []byte("echo_seen  SELECT, INSERT  # one row per key\n")},
	}
	return p
}

// denied reports whether err is the server refusing a privilege.
func denied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains([]uint16{1044, 1142, 1143, 1227}, me.Number)
}

// TestMigrateGrantsLeastPrivilege uses a database where the application user has no
// privilege of its own, as in a deployment. `router migrate` grants the user exactly what
// the migrations' grants files list, table by table. The whole router then runs as that
// user. It consumes, and it uses the inbox, the plugin's table and the outbox. The
// exactly-once relay runs with its lease, membership and retention, and so do the inbox
// cleaner and a replay. The server refuses what no file grants. That is DDL, TRUNCATE,
// changing the coupon audit trail or the coupons granted, deleting a replay's record and
// reading goose's version tables.
func TestMigrateGrantsLeastPrivilege(t *testing.T) {
	g := testenv.GrantsDB(t)
	kc := testenv.Kafka(t)
	ctx := context.Background()
	in := testenv.Topic(t, kc, "grants-in", 3)
	out := testenv.Topic(t, kc, "grants-out", 3)
	positions := testenv.TopicWithConfig(t, kc, "grants-positions", 1, map[string]string{"cleanup.policy": "compact"})
	echo := grantedEcho(in, out)
	reg := []inbox.Plugin{echo}
	for _, name := range []string{coupon.PluginName, notify.PluginName} {
		i := slices.IndexFunc(inbox.RegisteredPlugins(), func(p inbox.Plugin) bool { return p.Name == name })
		if i < 0 {
			t.Fatalf("plugin %s is not registered", name)
		}
		reg = append(reg, inbox.RegisteredPlugins()[i])
	}

	// Before the migration the application user cannot even choose the database.
	if db, err := dbx.Open(ctx, dbx.Config{DSN: g.DSN, MaxOpenConns: 1}); err == nil {
		db.Close()
		t.Fatalf("the application user reaches %s before any grant", g.Name)
	}
	// --grants=false only migrates, and the application user still has nothing.
	outText, err := cli(t, reg, "--dsn", g.DSN, "migrate", "--admin-dsn", g.AdminDSN, "--grants=false")
	if err != nil || !strings.Contains(outText, "grants left as they are") {
		t.Fatalf("migrate --grants=false: %v\n%s", err, outText)
	}
	if db, err := dbx.Open(ctx, dbx.Config{DSN: g.DSN, MaxOpenConns: 1}); err == nil {
		db.Close()
		t.Fatalf("the application user reaches %s after migrate --grants=false", g.Name)
	}
	outText, err = cli(t, reg, "--dsn", g.DSN, "migrate", "--admin-dsn", g.AdminDSN)
	if err != nil {
		t.Fatalf("migrate: %v\n%s", err, outText)
	}
	if !strings.Contains(outText, "migrate: granted "+g.Account+" its privileges on ") || strings.Contains(outText, "WARNING") {
		t.Fatalf("migrate output:\n%s", outText)
	}
	db, err := dbx.Open(ctx, dbx.Config{DSN: g.DSN, MaxOpenConns: 4})
	if err != nil {
		t.Fatalf("the application user after migrate: %v", err)
	}
	defer db.Close()

	// The privileges are the files' and nothing else. The user has none on the database as
	// a whole, and on each table exactly the listed ones.
	list, err := migrations.Grants(testenv.Dialect(), migrationSetsOf(reg)...)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	var tables []string
	if err := scanStrings(ctx, db, &tables, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"); err != nil {
		t.Fatal(err)
	}
	for _, gr := range list {
		if slices.Contains(tables, gr.Table) {
			want[gr.Table] = strings.Join(gr.Privileges, ",")
		}
	}
	got := map[string]string{}
	rows, err := db.QueryContext(ctx, `SELECT table_name, GROUP_CONCAT(privilege_type ORDER BY FIELD(privilege_type, 'SELECT', 'INSERT', 'UPDATE', 'DELETE'))
 FROM information_schema.table_privileges WHERE table_schema = DATABASE() GROUP BY table_name`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tb, privs string
		if err := rows.Scan(&tb, &privs); err != nil {
			t.Fatal(err)
		}
		got[tb] = privs
	}
	rows.Close()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("table privileges of the application user:\n got %v\nwant %v", got, want)
	}
	for _, tb := range []string{"inbox", "outbox", "coupon_grant", "user_coupon", "notification", "echo_seen", "relay_lease"} {
		if _, ok := got[tb]; !ok {
			t.Errorf("no grant on %s", tb)
		}
	}
	var schemaPrivs int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.schema_privileges WHERE ? LIKE table_schema", g.Name).Scan(&schemaPrivs); err != nil || schemaPrivs != 0 {
		t.Errorf("%d privileges on the database as a whole (%v), want none", schemaPrivs, err)
	}

	// What the application must not do.
	for _, q := range []string{
		"DROP TABLE inbox",
		"TRUNCATE TABLE outbox",
		"ALTER TABLE outbox ADD COLUMN x INT",
		"CREATE TABLE scratch (id INT)",
		"CREATE INDEX ix ON inbox (status)",
		"DELETE FROM coupon_grant_log",
		"UPDATE coupon_grant_log SET to_state = 'GRANTED'",
		"DELETE FROM user_coupon",
		"UPDATE user_coupon SET value_cents = 0",
		"DELETE FROM coupon_grant",
		"DELETE FROM replay",
		"DELETE FROM replay_row",
		"DELETE FROM relay_lease",
		"UPDATE outbox_parked SET topic = 'elsewhere'",
		"DELETE FROM echo_seen",
		"SELECT COUNT(*) FROM " + migrations.FrameworkTable,
	} {
		if _, err := db.ExecContext(ctx, q); !denied(err) {
			t.Errorf("%s as the application user: %v, want access denied", q, err)
		}
	}

	// And what it does, as the whole router runs as the application user.
	cfg := onceflow.DefaultConfig()
	cfg.DB.DSN = g.DSN
	cfg.Kafka.Brokers = kc.Brokers
	cfg.Kafka.SessionTimeout, cfg.Kafka.RebalanceTimeout, cfg.Kafka.HeartbeatEvery = 6*time.Second, 10*time.Second, time.Second
	cfg.Admin.Listen = ""
	cfg.Relay.Enabled, cfg.Relay.ExactlyOnce = true, true
	cfg.Relay.PositionsTopic = positions
	cfg.Relay.TransactionalID = "onceflow-relay-" + in
	cfg.Relay.Retention, cfg.Relay.CleanupInterval = time.Millisecond, time.Second // published rows deleted at once
	cfg.Plugins = map[string]map[string]any{echo.Name: {"topics": []any{in}, "consumer_group": "g-" + in}}
	rt, err := onceflow.New(cfg, []inbox.Plugin{echo}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 30
	var keys []string
	for i := range n {
		keys = append(keys, fmt.Sprintf("g-%03d", i))
	}
	produceKeys(t, kc, in, keys...)
	produceKeys(t, kc, in, keys[:5]...) // duplicates, counted on their inbox rows
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rt.Run(runCtx) }()
	var recs []kafkax.Record
	waitFor(t, fmt.Sprintf("%d events read back and their outbox rows deleted after publishing", n), func() bool {
		select {
		case err := <-done:
			t.Fatalf("run ended early: %v", err)
		default:
		}
		recs, err = kc.ReadAll(ctx, out, time.Second)
		var left int
		_ = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&left)
		return err == nil && len(recs) >= n && left == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run as the application user: %v", err)
	}
	if len(recs) != n {
		t.Errorf("%d events read back, want %d", len(recs), n)
	}
	var dups int
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(SUM(duplicates), 0) FROM inbox WHERE biz_type = 'echo'").Scan(&dups); err != nil || dups != 5 {
		t.Errorf("duplicates counted: %d (%v), want 5", dups, err)
	}
	var delivered int // the router's deliveries per minute, written at shutdown at the latest
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(SUM(n), 0) FROM inbox_history WHERE biz_type = 'echo'").Scan(&delivered); err != nil || delivered != n+5 {
		t.Errorf("deliveries in inbox_history: %d (%v), want %d", delivered, err, n+5)
	}

	// A replay of the done rows finds duplicates and stamps each row. Then the cleaner runs
	// past retention.
	outText, err = cli(t, reg, "--dsn", g.DSN, "replay", "--biz-type", "echo", "--status", "done")
	if err != nil || !strings.Contains(outText, fmt.Sprintf("selected=%d processed=0 duplicates=%d", n, n)) {
		t.Fatalf("replay as the application user: %v\n%s", err, outText)
	}
	cl, err := inboxops.NewCleaner(db, engine.CleanerConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	if deleted, err := cl.RunOnce(ctx, time.Now().Add(30*24*time.Hour)); err != nil || deleted != n {
		t.Fatalf("cleaner as the application user: %d deleted (%v), want %d", deleted, err, n)
	}
}

// migrationSetsOf is what `router migrate` applies for the plugins of reg, in name order.
func migrationSetsOf(reg []inbox.Plugin) []migrations.Set {
	var sets []migrations.Set
	for _, p := range slices.SortedFunc(slices.Values(reg), func(a, b inbox.Plugin) int { return strings.Compare(a.Name, b.Name) }) {
		if p.Migrations != nil {
			sets = append(sets, migrations.Set{Name: p.Name, FS: p.Migrations})
		}
	}
	return sets
}

func scanStrings(ctx context.Context, db *sql.DB, out *[]string, q string, args ...any) error {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		*out = append(*out, s)
	}
	return rows.Err()
}

// TestMigratePrintGrants checks that `router migrate --print-grants` prints the statements
// a DBA runs for the user of db.dsn, without connecting. Without db.dsn it exits with code
// 2 and names the key.
func TestMigratePrintGrants(t *testing.T) {
	reg := []inbox.Plugin{grantedEcho("in", "out")}
	out, err := cli(t, reg, "--dsn", "app:secret@tcp(127.0.0.1:1)/db", "migrate", "--print-grants")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"GRANT SELECT, INSERT, UPDATE, DELETE ON `inbox` TO `app`@`%`;", "GRANT SELECT, INSERT ON `echo_seen` TO `app`@`%`;"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "secret") {
		t.Errorf("the password is printed:\n%s", out)
	}
	if _, err := cli(t, reg, "--config", writeAdminOnly(t), "migrate", "--print-grants"); routercmd.ExitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), "db.dsn") {
		t.Errorf("without db.dsn: %v, want exit 2 naming db.dsn", err)
	}
}

// writeAdminOnly is a configuration file without db.dsn.
func writeAdminOnly(t *testing.T) string {
	t.Helper()
	f := t.TempDir() + "/router.yaml"
	if err := os.WriteFile(f, []byte("admin:\n  listen: ''\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

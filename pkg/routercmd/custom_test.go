package routercmd_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

// tally is an out-of-tree plugin as a team would write it. It has its own table, with its
// own migrations numbered from 00001, and its own settings. Its handler counts each key
// once and holds a resource that it releases in Close.
type tally struct {
	note   string
	closed atomic.Bool
	late   atomic.Int64 // deliveries handled after Close
}

var (
	_ inbox.Handler = (*tally)(nil)
	_ io.Closer     = (*tally)(nil)
)

func (h *tally) Decode(m *message.Message) (inbox.Decoded, error) {
	if len(m.Payload) == 0 {
		return inbox.Decoded{}, inbox.PoisonError("empty payload")
	}
	return inbox.Decoded{Key: string(m.Payload)}, nil
}

func (h *tally) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if h.closed.Load() {
		h.late.Add(1)
	}
	_, err := tx.ExecContext(ctx, tallyInsert, d.Key, h.note)
	return inbox.Done, err
}

// tallyInsert counts a key, in the tests' dialect.
var tallyInsert = func() string {
	if testenv.Dialect().IsPostgres() {
		return "INSERT INTO tally (k, n, note) VALUES ($1, 1, $2) ON CONFLICT (k) DO UPDATE SET n = tally.n + 1"
	}
	return "INSERT INTO tally (k, n, note) VALUES (?, 1, ?) ON DUPLICATE KEY UPDATE n = n + 1"
}()

func (h *tally) Close() error {
	h.closed.Store(true)
	return nil
}

var tallyMigrations = fstest.MapFS{
	"00001_tally.sql": {Data: []byte("-- +goose Up\nCREATE TABLE tally (k VARCHAR(64) NOT NULL PRIMARY KEY, n INT NOT NULL) ENGINE = InnoDB;\n-- +goose Down\nDROP TABLE tally;\n")},
	"00002_tally_note.sql": {Data: []byte("-- +goose Up\nALTER TABLE tally ADD COLUMN note VARCHAR(64) NOT NULL DEFAULT '';\n" +
		"-- +goose Down\nALTER TABLE tally DROP COLUMN note;\n")},
	"postgres/00001_tally.sql": {Data: []byte("-- +goose Up\nCREATE TABLE tally (k VARCHAR(64) NOT NULL PRIMARY KEY, n INTEGER NOT NULL);\n-- +goose Down\nDROP TABLE tally;\n")},
	"postgres/00002_tally_note.sql": {Data: []byte("-- +goose Up\nALTER TABLE tally ADD COLUMN note VARCHAR(64) NOT NULL DEFAULT '';\n" +
		"-- +goose Down\nALTER TABLE tally DROP COLUMN note;\n")},
}

// tallySettings are the tally plugin's settings, plugins.tally-counter.note.
type tallySettings struct {
	Note string `key:"note" default:"default" help:"the note each counted row keeps"`
}

// tallyPlugin declares the plugin. built records the handlers that its Build made.
func tallyPlugin(built *[]*tally) inbox.Plugin {
	return inbox.Plugin{
		Name: "tally-counter", Topics: []string{"tally-in"}, ConsumerGroup: "tally-default", BizType: "tally",
		Migrations: tallyMigrations,
		Tables:     []string{"tally"},
		Settings:   tallySettings{}, // topics and consumer_group are the runtime's and never reach it
		Build: func(ctx context.Context, env inbox.PluginEnv) (inbox.Handler, error) {
			h := &tally{note: env.Settings.(tallySettings).Note}
			*built = append(*built, h)
			return h, nil
		},
	}
}

func migrationsOf(p inbox.Plugin) migrations.Set {
	return migrations.Set{Name: p.Name, FS: p.Migrations}
}

// cli runs the command line with the test's plugins and returns its stdout.
func cli(t *testing.T, reg []inbox.Plugin, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	runErr := routercmd.Run(context.Background(), args, routercmd.WithPlugins(reg...))
	w.Close()
	os.Stdout = old
	return <-done, runErr
}

func produceKeys(t *testing.T, kc kafkax.Config, topic string, keys ...string) {
	t.Helper()
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var msgs []*sarama.ProducerMessage
	for _, k := range keys {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(k),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}})
	}
	if err := p.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestCustomBinary runs a binary of one's own, as a team builds it from its own module. It
// is the runtime's command line with a plugin of its own, given here with WithPlugins
// instead of a blank import. `migrate` applies the plugin's migrations after the
// framework's, in the plugin's own version table. `plugins` shows the topic and group that
// the deployment configured. `run` consumes that topic in that group, although the
// declaration's topic does not even exist. It counts every key once and closes the handler
// once the router has stopped. `migrate --reset` rolls it all back.
func TestCustomBinary(t *testing.T) {
	d := testenv.DB(t, 4) // the framework's tables only
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "tally-in", 2)
	group := "tally-" + topic
	var built []*tally
	reg := []inbox.Plugin{tallyPlugin(&built)}

	cfgFile := filepath.Join(t.TempDir(), "router.yaml")
	body := fmt.Sprintf(`db:
  dsn: %q
  admin_dsn: %q
kafka:
  brokers: [%q]
admin:
  listen: ''
relay:
  enabled: false
plugins:
  tally-counter:
    topics: [%q]
    consumer_group: %q
    note: from-config
`, d.DSN, d.AdminDSN, kc.Brokers[0], topic, group)
	if err := os.WriteFile(cfgFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := cli(t, reg, append([]string{"--config", cfgFile}, args...)...)
		if err != nil {
			t.Fatalf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	// Before the migration, run refuses to start, naming the plugin's table.
	if _, err := cli(t, reg, "--config", cfgFile, "run"); err == nil || !strings.Contains(err.Error(), "table tally is missing") {
		t.Fatalf("run before migrate: %v, want the missing table named", err)
	}
	out := run("migrate")
	if !strings.Contains(out, "migrate: plugin tally-counter: 2 migrations applied, version 0 → 2\n") {
		t.Fatalf("migrate: %s", out)
	}
	if versions := appliedVersions(t, d.Admin, "goose_db_version_tally_counter"); versions != "1,2" {
		t.Fatalf("plugin version table: %q, want 1,2", versions)
	}
	var leaked int
	latest := latestFrameworkMigration(t)
	if err := d.Admin.QueryRow(testenv.Dialect().Rebind("SELECT COUNT(*) FROM goose_db_version WHERE version_id > ?"), latest).Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("framework version table holds %d plugin versions (%v)", leaked, err)
	}
	out = run("migrate", "--status")
	for _, w := range []string{fmt.Sprintf("onceflow %05d", latest), "tally-counter 00001 00001_tally.sql applied", "tally-counter 00002 00002_tally_note.sql applied"} {
		if !strings.Contains(out, w) {
			t.Errorf("migrate --status lacks %q:\n%s", w, out)
		}
	}
	out = run("plugins")
	for _, w := range []string{"tally-counter", topic, group, "tally", "goose_db_version_tally_counter"} {
		if !strings.Contains(out, w) {
			t.Errorf("plugins lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "tally-in ") || strings.Contains(out, "tally-default") {
		t.Errorf("plugins shows the declaration's topic or group, not the configured ones:\n%s", out)
	}

	produceKeys(t, kc, topic, "k-1", "k-2", "k-3", "k-1", "k-4", "k-2")
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() {
		runErr <- routercmd.Run(ctx, []string{"--config", cfgFile, "run"}, routercmd.WithPlugins(reg...))
	}()
	count := func(q string) int {
		var n int
		if err := d.DB.QueryRow(q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	waitFor(t, "four keys counted", func() bool { return count("SELECT COUNT(*) FROM tally") == 4 })
	waitFor(t, "the configured group to commit every offset", func() bool {
		for _, lag := range testenv.CommittedLag(t, kc, group, topic) {
			if lag != 0 {
				return false
			}
		}
		return true
	})
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run did not stop")
	}
	if n := count("SELECT COUNT(*) FROM tally WHERE n = 1 AND note = 'from-config'"); n != 4 {
		t.Fatalf("%d keys counted once with the configured note, want 4", n)
	}
	if n := count("SELECT COUNT(*) FROM inbox WHERE biz_type = 'tally' AND status = 'done' AND duplicates = 1"); n != 2 {
		t.Fatalf("%d keys with a blocked duplicate, want 2", n)
	}
	if len(built) != 1 || !built[0].closed.Load() || built[0].late.Load() != 0 {
		t.Fatalf("handlers built %d, closed %v, handled after close %d; want one, closed after its last delivery", len(built), len(built) > 0 && built[0].closed.Load(), built[0].late.Load())
	}
	for _, lag := range testenv.CommittedLag(t, kc, "tally-default", topic) {
		if lag == 0 {
			t.Fatal("the declaration's consumer group committed offsets: the configured one was not used")
		}
	}

	run("migrate", "--reset")
	var tables int
	schema := "DATABASE()"
	if testenv.Dialect().IsPostgres() {
		schema = "current_schema()"
	}
	if err := d.Admin.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = " + schema + " AND table_name NOT LIKE 'goose%'").Scan(&tables); err != nil || tables != 10+1 {
		t.Fatalf("tables after migrate --reset (rolled back, then up again): %d %v, want the framework's 10 and tally", tables, err)
	}
}

// appliedVersions lists the applied versions of a goose version table, comma separated.
func appliedVersions(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	rows, err := db.Query("SELECT version_id FROM " + table + " WHERE version_id > 0 AND is_applied ORDER BY version_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var vs []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(vs, ",")
}

// TestPluginOverridesChecked checks a deployment's topics and consumer group before
// anything connects. A bad one is bad input and exits with code 2.
func TestPluginOverridesChecked(t *testing.T) {
	var built []*tally
	reg := []inbox.Plugin{tallyPlugin(&built)}
	for _, tc := range []struct {
		name, section, want string
	}{
		{"bad topic", "topics: ['no spaces allowed']", "invalid kafka topic name"},
		{"empty topics", "topics: []", "topics is empty"},
		{"topic twice", "topics: [a, a]", `"a" twice`},
		{"bad group", "consumer_group: 'a b'", "consumer_group"},
		{"group not a string", "consumer_group: [x]", "consumer_group"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "router.yaml")
			if err := os.WriteFile(f, []byte("admin:\n  listen: ''\nplugins:\n  tally-counter:\n    "+tc.section+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := cli(t, reg, "--config", f, "plugins")
			if err == nil || routercmd.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "tally-counter") {
				t.Fatalf("%v (exit %d), want exit 2 naming the plugin and %q", err, routercmd.ExitCode(err), tc.want)
			}
		})
	}
}

// TestVerifyPluginInvariants runs `router verify` with a plugin's own invariants. It checks
// the plugin's summary and violations, and the ledger's keys handed to the plugin. --wait
// waits while the plugin reports work in flight. The RESULT line holds the plugin's fields.
func TestVerifyPluginInvariants(t *testing.T) {
	d := testenv.DB(t, 2)
	var calls atomic.Int64
	var keys []string
	p := inbox.Plugin{Name: "auditor", Topics: []string{"t"}, ConsumerGroup: "g", BizType: "audit",
		Build: func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return &tally{}, nil },
		Verify: func(ctx context.Context, env inbox.VerifyEnv) (inbox.Verification, error) {
			n := calls.Add(1)
			keys = env.Keys
			v := inbox.Verification{Summary: fmt.Sprintf("audits=%d", n), Pending: n < 3, Result: "widgets=7", Notes: []string{"a note"}}
			if err := env.DB.PingContext(ctx); err != nil {
				return v, err
			}
			for _, k := range env.Keys {
				if k == "bad" {
					v.Violations = append(v.Violations, "key bad has no widget")
				}
			}
			return v, nil
		}}
	reg := []inbox.Plugin{p}
	ledger := filepath.Join(t.TempDir(), "ledger.txt")
	if err := os.WriteFile(ledger, []byte("# prefix=p orders=2 deliveries=3 poison=1\nk-1\nbad\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := cli(t, reg, "--dsn", d.DSN, "verify", "--ledger", ledger, "--result", "--wait", "30s")
	if err == nil || routercmd.ExitCode(err) != 1 || !strings.Contains(err.Error(), "1 invariant violations") {
		t.Fatalf("verify: %v, want exit 1 for one violation\n%s", err, out)
	}
	for _, w := range []string{"a note\n", "verify: audits=3 processing_rows=0 unpublished_events=0 outbox_parked=0\n", "VIOLATION key bad has no widget\n", "RESULT orders=2 deliveries=3 widgets=7\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("verify output lacks %q:\n%s", w, out)
		}
	}
	if strings.Join(keys, ",") != "k-1,bad" {
		t.Errorf("plugin got keys %v, want the ledger's", keys)
	}
	if _, err := cli(t, reg, "--dsn", d.DSN, "produce", "--orders", "1"); err == nil || routercmd.ExitCode(err) != 2 || !strings.Contains(err.Error(), "Sample") {
		t.Fatalf("produce for plugins without a Sample: %v, want exit 2 naming Sample", err)
	}
}

// latestFrameworkMigration is the version of the framework's newest migration file.
func latestFrameworkMigration(t *testing.T) int {
	t.Helper()
	dir, err := migrations.ForDialect("the framework", migrations.FS, testenv.Dialect())
	if err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(dir, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("framework migrations: %v %v", files, err)
	}
	var v int
	if _, err := fmt.Sscanf(files[len(files)-1], "%05d", &v); err != nil {
		t.Fatal(err)
	}
	return v
}

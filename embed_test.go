package onceflow_test

// The runtime embedded in a program of one's own (New, then Runtime.Run), with a plugin of
// its own; pkg/routercmd's tests run the same kind of plugin through the command line.

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// tally is an out-of-tree plugin as a team would write it: its own table (its own
// migrations, numbered from 00001), its own settings, a handler that counts each key once
// and holds a resource it releases in Close.
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

// tallyPlugin declares the plugin; built records the handlers its Build made.
func tallyPlugin(built *[]*tally) inbox.Plugin {
	return inbox.Plugin{
		Name: "tally-counter", Topics: []string{"tally-in"}, ConsumerGroup: "tally-default", BizType: "tally",
		Migrations: tallyMigrations,
		Tables:     []string{"tally"},
		Settings:   tallySettings{}, // topics and consumer_group are the runtime's: they never reach it
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

// A group commit the inbox refuses to build stops Run before anything is consumed, naming
// the plugin and the setting (it used to fall back, silently, to one delivery per
// transaction).
func TestRunFailsWhenGroupCommitCannotStart(t *testing.T) {
	var built []*tally
	p := tallyPlugin(&built)
	d := testenv.DB(t, 4, migrationsOf(p))
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "tally-nobatch", 1)
	cfg := onceflow.DefaultConfig()
	cfg.DB.DSN = d.DSN
	cfg.Kafka.Brokers = kc.Brokers
	cfg.Admin.Listen = ""
	cfg.Relay.Enabled = false
	cfg.Plugins = map[string]map[string]any{p.Name: {"topics": []any{topic}, "consumer_group": "g-" + topic}}
	rt, err := onceflow.New(cfg, []inbox.Plugin{p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	onceflow.SetConfigUnchecked(rt, func(c *onceflow.Config) { c.Inbox.Batch.Workers = 65 }) // engine.BatchConfig allows 1..64
	produceKeys(t, kc, topic, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = rt.Run(ctx)
	if err == nil || !errors.Is(err, onceflow.ErrBadInput) || !strings.Contains(err.Error(), "group commit") || !strings.Contains(err.Error(), p.Name) {
		t.Fatalf("run: %v (bad input: %t), want bad input naming the plugin and its group commit", err, errors.Is(err, onceflow.ErrBadInput))
	}
	var n int
	if err := d.DB.QueryRow("SELECT COUNT(*) FROM tally").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys counted (%v), want none: nothing runs without its group commit", n, err)
	}
}

// A plugin whose migrations have no files for the database's dialect is refused at start
// as bad input, naming the plugin and the dialect, before anything is consumed.
func TestRunRefusesPluginWithoutMigrationsForDialect(t *testing.T) {
	var built []*tally
	p := tallyPlugin(&built)
	d := testenv.DB(t, 4, migrationsOf(p))
	// The plugin as shipped for the other dialects only.
	other := fstest.MapFS{}
	for name, f := range tallyMigrations {
		if strings.HasPrefix(name, migrations.PostgresDir+"/") != testenv.Dialect().IsPostgres() {
			other[name] = f
		}
	}
	p.Migrations = other
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "tally-dialect", 1)
	cfg := onceflow.DefaultConfig()
	cfg.DB.DSN = d.DSN
	cfg.DB.Dialect = testenv.Config(d.DSN, 1).Dialect
	cfg.Kafka.Brokers = kc.Brokers
	cfg.Admin.Listen = ""
	cfg.Relay.Enabled = false
	cfg.Plugins = map[string]map[string]any{p.Name: {"topics": []any{topic}, "consumer_group": "g-" + topic}}
	rt, err := onceflow.New(cfg, []inbox.Plugin{p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = rt.Run(ctx)
	if err == nil || !errors.Is(err, onceflow.ErrBadInput) || !strings.Contains(err.Error(), "plugin "+p.Name) || !strings.Contains(err.Error(), string(testenv.Dialect())) {
		t.Fatalf("run: %v (bad input: %t), want bad input naming plugin %s and dialect %s", err, errors.Is(err, onceflow.ErrBadInput), p.Name, testenv.Dialect())
	}
	if len(built) != 0 {
		t.Fatalf("%d handlers built, want none", len(built))
	}
}

// The runtime embedded in a program of one's own (New, Run): the same pipeline as `router
// run`, the plugin's handler closed once Run returns.
func TestRuntimeEmbedded(t *testing.T) {
	var built []*tally
	p := tallyPlugin(&built)
	d := testenv.DB(t, 4, migrationsOf(p))
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "tally-embedded", 1)

	cfg := onceflow.DefaultConfig()
	cfg.DB.DSN = d.DSN
	cfg.Kafka.Brokers = kc.Brokers
	cfg.Admin.Listen = ""
	cfg.Relay.Enabled = false
	cfg.Plugins = map[string]map[string]any{p.Name: {"topics": []any{topic}, "consumer_group": "g-" + topic}}
	rt, err := onceflow.New(cfg, []inbox.Plugin{p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rt.Plugins()[0]; got.Topics[0] != topic || got.ConsumerGroup != "g-"+topic {
		t.Fatalf("runtime's plugin: topics %v group %s", got.Topics, got.ConsumerGroup)
	}
	produceKeys(t, kc, topic, "a", "b", "a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	waitFor(t, "two keys counted", func() bool {
		var n int
		_ = d.DB.QueryRow("SELECT COUNT(*) FROM tally WHERE note = 'default'").Scan(&n)
		return n == 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(built) != 1 || !built[0].closed.Load() {
		t.Fatal("handler not closed after Run returned")
	}

	if _, err := onceflow.New(cfg, nil, nil); err == nil || !errors.Is(err, onceflow.ErrBadInput) {
		t.Fatalf("New without plugins: %v, want bad input", err)
	}
	cfg.Kafka.Brokers = nil
	if _, err := onceflow.New(cfg, []inbox.Plugin{p}, nil); err == nil || !errors.Is(err, onceflow.ErrBadInput) {
		t.Fatalf("New with no brokers: %v, want bad input", err)
	}
}

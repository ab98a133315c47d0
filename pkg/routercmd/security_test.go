package routercmd_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

// echo is a plugin that records each key once and emits one outbox event per key.
type echo struct {
	out string
	w   *outbox.Writer
}

func (h *echo) Decode(m *message.Message) (inbox.Decoded, error) {
	if len(m.Payload) == 0 {
		return inbox.Decoded{}, inbox.PoisonError("empty payload")
	}
	return inbox.Decoded{Key: string(m.Payload)}, nil
}

func (h *echo) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if _, err := tx.ExecContext(ctx, echoInsert, d.Key); err != nil {
		return 0, err
	}
	return inbox.Done, h.w.Add(ctx, tx, outbox.Event{ID: "echo-" + d.Key, Type: "Echoed", Topic: h.out, Key: d.Key, Payload: []byte(d.Key)})
}

var echoInsert = testenv.Dialect().Rebind("INSERT INTO echo_seen (k) VALUES (?)")

func echoPlugin(in, out string) inbox.Plugin {
	return inbox.Plugin{
		Name: "echo", Topics: []string{in}, ConsumerGroup: "echo-" + in, BizType: "echo",
		Migrations: fstest.MapFS{
			"00001_echo.sql":          {Data: []byte("-- +goose Up\nCREATE TABLE echo_seen (k VARCHAR(64) NOT NULL PRIMARY KEY) ENGINE = InnoDB;\n-- +goose Down\nDROP TABLE echo_seen;\n")},
			"postgres/00001_echo.sql": {Data: []byte("-- +goose Up\nCREATE TABLE echo_seen (k VARCHAR(64) NOT NULL PRIMARY KEY);\n-- +goose Down\nDROP TABLE echo_seen;\n")},
		},
		Tables: []string{"echo_seen"},
		Writes: func(any) ([]string, error) { return []string{out}, nil },
		Build: func(context.Context, inbox.PluginEnv) (inbox.Handler, error) {
			w, err := outbox.NewWriter("outbox")
			return &echo{out: out, w: w}, err
		},
	}
}

// secureConfig is the router's configuration for the SASL_SSL listener only, with
// kafka.tls.* and kafka.sasl.* and a password file. It is also for the MariaDB user that
// must use TLS, with db.tls.* and db.password_file. The DSN carries no password.
func secureConfig(t *testing.T, d testenv.Database, kc kafkax.Config) onceflow.Config {
	t.Helper()
	mc, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	user, pass, _ := strings.Cut(testenv.TLSAppUser(), ":")
	mc.User, mc.Passwd = user, ""
	pwFile := filepath.Join(t.TempDir(), "db.password")
	if err := os.WriteFile(pwFile, []byte(pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := onceflow.DefaultConfig()
	cfg.DB.DSN = mc.FormatDSN()
	cfg.DB.PasswordFile = pwFile
	cfg.DB.TLS.CAFile = testenv.TLSFile("ca.pem")
	cfg.Kafka.Brokers = kc.Brokers
	cfg.Kafka.TLS = kafkax.TLS{Enabled: true, CAFile: kc.TLS.CAFile}
	cfg.Kafka.SASL = kafkax.SASL{Mechanism: kc.SASL.Mechanism, User: kc.SASL.User, PasswordFile: kc.SASL.PasswordFile}
	cfg.Kafka.SessionTimeout, cfg.Kafka.RebalanceTimeout, cfg.Kafka.HeartbeatEvery = 6*time.Second, 10*time.Second, time.Second
	cfg.Admin.Listen = ""
	return cfg
}

// TestPipelineOverSASLSSL runs the whole pipeline over the SASL_SSL listener alone. That
// covers consume, inbox, outbox, the read_committed read back, and the exactly-once relay
// with its transactional producer, positions topic and lease. A user that must use TLS
// reaches the database over TLS.
func TestPipelineOverSASLSSL(t *testing.T) {
	kc := testenv.SecureKafka(t)
	in := testenv.Topic(t, kc, "sasl-in", 3)
	out := testenv.Topic(t, kc, "sasl-out", 3)
	positions := testenv.TopicWithConfig(t, kc, "sasl-positions", 1, map[string]string{"cleanup.policy": "compact"})
	p := echoPlugin(in, out)
	d := testenv.DB(t, 4, migrationsOf(p))

	cfg := secureConfig(t, d, kc)
	cfg.Relay.Enabled, cfg.Relay.ExactlyOnce = true, true
	cfg.Relay.PositionsTopic = positions
	cfg.Relay.TransactionalID = "onceflow-relay-" + in
	cfg.Plugins = map[string]map[string]any{p.Name: {"topics": []any{in}, "consumer_group": "g-" + in}}
	rt, err := onceflow.New(cfg, []inbox.Plugin{p}, nil)
	if err != nil {
		t.Fatal(err)
	}

	const n = 40
	var keys []string
	for i := range n {
		keys = append(keys, fmt.Sprintf("k-%03d", i))
	}
	produceKeys(t, kc, in, keys...)
	produceKeys(t, kc, in, keys[:10]...) // redelivered copies, which the inbox absorbs

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	var recs []kafkax.Record
	waitFor(t, fmt.Sprintf("%d events read back (read_committed) over SASL_SSL", n), func() bool {
		select {
		case err := <-done:
			t.Fatalf("run ended early: %v", err)
		default:
		}
		recs, err = kc.ReadAll(context.Background(), out, time.Second)
		return err == nil && len(recs) >= n
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	recs, err = kc.ReadAll(context.Background(), out, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Headers["event_id"]]++
	}
	for _, k := range keys {
		if seen["echo-"+k] != 1 {
			t.Errorf("event echo-%s read back %d times, want once", k, seen["echo-"+k])
		}
	}
	if len(recs) != n {
		t.Errorf("%d records read back, want %d", len(recs), n)
	}
	var rows int
	if err := d.DB.QueryRow("SELECT COUNT(*) FROM echo_seen").Scan(&rows); err != nil || rows != n {
		t.Errorf("echo_seen has %d rows (%v), want %d", rows, err, n)
	}
}

// TestRunRefusedBySASLSSL checks that `router run` with a wrong SASL password stops at
// start. So does a run that trusts a CA that did not sign the broker's certificate. Each
// exits with code 1 and one line that names the broker and the cause.
func TestRunRefusedBySASLSSL(t *testing.T) {
	kc := testenv.SecureKafka(t)
	in := testenv.Topic(t, kc, "sasl-refused", 1)
	p := echoPlugin(in, in)
	d := testenv.DB(t, 2, migrationsOf(p))
	reg := []inbox.Plugin{p}
	dir := t.TempDir()
	wrongPW := filepath.Join(dir, "wrong.password")
	if err := os.WriteFile(wrongPW, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	otherCA := testenv.OtherCA(t)
	broker := kc.Brokers[0]
	for _, tc := range []struct {
		name, caFile, pwFile, want string
	}{
		{"wrong password", kc.TLS.CAFile, wrongPW, "SASL authentication failed"},
		{"untrusted CA", otherCA, kc.SASL.PasswordFile, "authority not trusted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "router.yaml")
			yaml := fmt.Sprintf(`db:
  dsn: '%s'
kafka:
  brokers: [%s]
  tls: {enabled: true, ca_file: '%s'}
  sasl: {mechanism: %s, user: %s, password_file: '%s'}
admin: {listen: ''}
relay: {enabled: false}
plugins:
  echo: {topics: [%s], consumer_group: g-%s}
`, d.DSN, broker, tc.caFile, kc.SASL.Mechanism, kc.SASL.User, tc.pwFile, in, in)
			if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err := cli(t, reg, "--config", f, "run")
			if err == nil {
				t.Fatal("run started")
			}
			msg := err.Error()
			if code := routercmd.ExitCode(err); code != 1 {
				t.Fatalf("exit %d (%s), want 1", code, msg)
			}
			if strings.Contains(msg, "\n") || !strings.Contains(msg, broker) || !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q: want one line naming %s and %q", msg, broker, tc.want)
			}
			if strings.Contains(msg, "not-the-password") {
				t.Fatalf("error shows the password: %q", msg)
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("took %s to fail", time.Since(start))
			}
			t.Logf("exit 1: %s", msg)
		})
	}
}

// withoutPassword splits a DSN of the tests' dialect into the DSN without its password and
// the password.
func withoutPassword(t *testing.T, dsn string) (string, string) {
	t.Helper()
	if testenv.Dialect().IsPostgres() {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pw, _ := u.User.Password()
		u.User = url.User(u.User.Username())
		return u.String(), pw
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw := mc.Passwd
	mc.Passwd = ""
	return mc.FormatDSN(), pw
}

// TestDatabaseSecrets checks that no credentials are built in. A command that connects
// without db.dsn or db.admin_dsn exits with code 2 and names the key. Passwords come from
// the environment or a file instead of the DSN.
func TestDatabaseSecrets(t *testing.T) {
	d := testenv.DB(t, 1)
	var reg []inbox.Plugin
	t.Setenv("ONCEFLOW_CONFIG", "")
	t.Setenv("ONCEFLOW_DB_DSN", "")
	t.Setenv("ONCEFLOW_DB_ADMIN_DSN", "")
	for _, tc := range []struct {
		args []string
		key  string
	}{
		{[]string{"outbox", "ls"}, "db.dsn"},
		{[]string{"migrate", "--status"}, "db.admin_dsn"},
	} {
		_, err := cli(t, reg, tc.args...)
		if err == nil || routercmd.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.key+" is empty") {
			t.Fatalf("%v without a DSN: %v (exit %d), want exit 2 naming %s", tc.args, err, routercmd.ExitCode(err), tc.key)
		}
	}

	adminDSN, adminPW := withoutPassword(t, d.AdminDSN)
	appDSN, appPW := withoutPassword(t, d.DSN)
	t.Setenv("ONCEFLOW_DB_DSN", appDSN)
	t.Setenv("ONCEFLOW_DB_ADMIN_DSN", adminDSN)

	// Passwords from the environment.
	t.Setenv("ONCEFLOW_DB_PASSWORD", appPW)
	t.Setenv("ONCEFLOW_DB_ADMIN_PASSWORD", adminPW)
	if out, err := cli(t, reg, "migrate", "--status"); err != nil || !strings.Contains(out, "applied") {
		t.Fatalf("migrate --status with ONCEFLOW_DB_ADMIN_PASSWORD: %v\n%s", err, out)
	}
	if out, err := cli(t, reg, "outbox", "ls"); err != nil {
		t.Fatalf("outbox ls with ONCEFLOW_DB_PASSWORD: %v\n%s", err, out)
	}

	// Passwords from files. A password set twice is refused.
	dir := t.TempDir()
	appFile, adminFile := filepath.Join(dir, "app"), filepath.Join(dir, "admin")
	if err := os.WriteFile(appFile, []byte(appPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(adminFile, []byte(adminPW+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, reg, "outbox", "ls"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ONCEFLOW_DB_PASSWORD_FILE", appFile)
	if _, err := cli(t, reg, "outbox", "ls"); err == nil || routercmd.ExitCode(err) != 2 || !strings.Contains(err.Error(), "set one") {
		t.Fatalf("db.password and db.password_file both set: %v, want exit 2", err)
	}
	t.Setenv("ONCEFLOW_DB_PASSWORD", "")
	t.Setenv("ONCEFLOW_DB_ADMIN_PASSWORD", "")
	t.Setenv("ONCEFLOW_DB_ADMIN_PASSWORD_FILE", adminFile)
	if out, err := cli(t, reg, "outbox", "ls"); err != nil {
		t.Fatalf("outbox ls with db.password_file: %v\n%s", err, out)
	}
	if out, err := cli(t, reg, "migrate", "--status"); err != nil || !strings.Contains(out, "applied") {
		t.Fatalf("migrate --status with db.admin_password_file: %v\n%s", err, out)
	}
	t.Setenv("ONCEFLOW_DB_PASSWORD_FILE", filepath.Join(dir, "missing"))
	if _, err := cli(t, reg, "outbox", "ls"); err == nil || routercmd.ExitCode(err) != 2 || !strings.Contains(err.Error(), "db.password_file") {
		t.Fatalf("missing db.password_file: %v, want exit 2 naming it", err)
	}
}

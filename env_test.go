package onceflow

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
)

// countingListener is a TCP listener on 127.0.0.1 that counts the connections it is offered
// and closes each at once, so a command that dials it fails fast.
func countingListener(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), &n
}

// An ONCEFLOW_ variable the router does not read (a typo of a setting or of a plugin's
// setting, a plugin's file-only key, another program's variable) or one it misreads (a
// broker count where kafka.brokers wants addresses, a plugin's rate out of its range) makes
// `router run` refuse it as bad input, one line naming the variable, and nothing connects:
// the database and the broker it is given count the connections they are offered.
func TestEnvRefusedBeforeConnecting(t *testing.T) {
	for _, tc := range []struct {
		env, value string
		want       []string
	}{
		{"ONCEFLOW_RELAY_SHARDZ", "4", []string{"ONCEFLOW_RELAY_SHARDZ is no setting", "did you mean ONCEFLOW_RELAY_SHARDS or ONCEFLOW_RELAY_SHARD?"}},
		{"ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATE", "1.5", []string{"(env ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATE)",
			"plugins.coupon-granter.step_failure_rate 1.5 outside 0..0.99"}},
		{"ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATZ", "0.1", []string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATZ is no setting of plugin coupon-granter",
			"did you mean ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATE?"}},
		{"ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_DELAY", "soon", []string{"(env ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_DELAY)", `invalid duration "soon"`}},
		{"ONCEFLOW_PLUGINS_COUPON_GRANTER_TOPICS", "a", []string{"plugins.coupon-granter.topics is read from the config file only"}},
		{"ONCEFLOW_PLUGINS_NO_SUCH_PLUGIN_KEY", "1", []string{"ONCEFLOW_PLUGINS_NO_SUCH_PLUGIN_KEY names no plugin's setting", "registered plugins: [", "coupon-granter"}},
		{"onceflow_relay_shards", "4", []string{"onceflow_relay_shards is no setting", "did you mean ONCEFLOW_RELAY_SHARDS?"}},
		{"ONCEFLOW_TEST_DB", "postgres", []string{"ONCEFLOW_TEST_DB is no setting"}},
		{"ONCEFLOW_KAFKA_BROKERS", "3", []string{"(env ONCEFLOW_KAFKA_BROKERS)", `"3"`}},
	} {
		t.Run(tc.env, func(t *testing.T) {
			db, dbConns := countingListener(t)
			broker, kafkaConns := countingListener(t)
			t.Setenv("ONCEFLOW_DB_DSN", "app@tcp("+db+")/shop")
			t.Setenv("ONCEFLOW_KAFKA_BROKERS", broker)
			t.Setenv("ONCEFLOW_ADMIN_LISTEN", "")
			t.Setenv(tc.env, tc.value)
			err := runRouter(context.Background(), "", "run")
			if err == nil || !isBadInput(err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%s=%s router run: %v (bad input: %t), want bad input with one line", tc.env, tc.value, err, isBadInput(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s=%s router run: %q does not say %q", tc.env, tc.value, err, w)
				}
			}
			if d, k := dbConns.Load(), kafkaConns.Load(); d != 0 || k != 0 {
				t.Errorf("%s=%s router run: %d connections to the database and %d to the broker before refusing it", tc.env, tc.value, d, k)
			}
		})
	}
}

// Every unknown variable is named in the one refusal, in name order, and a misread value is
// traced to its variable alone among the settings set.
func TestCheckEnv(t *testing.T) {
	type seeded struct {
		Seed int `key:"seed" range:"0..100" help:"seed"`
	}
	build := func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return nil, nil }
	plugins := []inbox.Plugin{
		{Name: "coupon-granter", Topics: []string{"t"}, ConsumerGroup: "g", BizType: "b", Build: build, Settings: seeded{}},
		{Name: "coupon", Topics: []string{"t"}, ConsumerGroup: "g", BizType: "c", Build: build},
	}
	for _, tc := range []struct {
		name    string
		environ []string
		want    []string // empty: accepted
	}{
		{"settings, the config file and other programs' variables", []string{"ONCEFLOW_CONFIG=r.yaml", "ONCEFLOW_DB_DSN=x", "ONCEFLOW_KAFKA_BROKERS=a:1",
			"ONCEFLOW_RELAY_SHARDS=4", "ONCEFLOW_INBOX_BREAKER_ENABLED=false", "INFRA_KAFKA_BROKERS=3", "OFTEST_DB=postgres", "CHAOS_RELAY_CRASH_POINT=after-mark", "PATH=/bin"}, nil},
		{"all unknown ones named", []string{"ONCEFLOW_B=1", "ONCEFLOW_A=1", "ONCEFLOW_DB_DSN=x"},
			[]string{"environment: ONCEFLOW_A is no setting of the router; ONCEFLOW_B is no setting of the router; the router reads ONCEFLOW_CONFIG"}},
		{"far from every name", []string{"ONCEFLOW_RUN_DIR=/tmp"}, []string{"ONCEFLOW_RUN_DIR is no setting of the router; "}},
		{"a plugin's setting", []string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_SEED=1"}, nil},
		{"the longest plugin name", []string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_SEDE=1"},
			[]string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_SEDE is no setting of plugin coupon-granter (did you mean ONCEFLOW_PLUGINS_COUPON_GRANTER_SEED?)"}},
		{"a plugin without settings", []string{"ONCEFLOW_PLUGINS_COUPON_SEED=1"}, []string{"ONCEFLOW_PLUGINS_COUPON_SEED is no setting of plugin coupon (it has none)"}},
		{"a plugin's reserved key", []string{"ONCEFLOW_PLUGINS_COUPON_TOPICS=a"}, []string{"ONCEFLOW_PLUGINS_COUPON_TOPICS: plugins.coupon.topics is read from the config file only"}},
		{"a plugin's setting in another case", []string{"onceflow_plugins_coupon_granter_seed=1"},
			[]string{"onceflow_plugins_coupon_granter_seed is no setting of plugin coupon-granter (did you mean ONCEFLOW_PLUGINS_COUPON_GRANTER_SEED?)"}},
		{"the plugins section", []string{"ONCEFLOW_PLUGINS=x"}, []string{"ONCEFLOW_PLUGINS names no plugin's setting (registered plugins: [coupon-granter coupon])"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkEnv(tc.environ, settingEnv(plugins), plugins)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !isBadInput(err) {
				t.Fatalf("%v (bad input: %t), want bad input", err, isBadInput(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
	// Three settings are set; the refused value is traced to the one that holds it.
	t.Setenv("ONCEFLOW_DB_DSN", "app@tcp(127.0.0.1:1)/shop")
	t.Setenv("ONCEFLOW_RELAY_BATCH_SIZE", "50000")
	t.Setenv("ONCEFLOW_LOG_LEVEL", "warn")
	_, err := LoadConfig("")
	if err == nil || !strings.Contains(err.Error(), "config (env ONCEFLOW_RELAY_BATCH_SIZE): relay.batch_size 50000 outside") {
		t.Errorf("LoadConfig: %v, want the refusal traced to ONCEFLOW_RELAY_BATCH_SIZE alone", err)
	}
}

// A plugin's setting binds from its variable, ONCEFLOW_PLUGINS_<NAME>_<KEY>, as a framework
// setting does: the variable over the file over the default, and the plugin is handed the
// value (its Writes and Build get the same decoded settings).
func TestPluginSettingFromEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "router.yaml")
	body := "plugins:\n  coupon-granter:\n    granted_topic: from-file\n    failed_topic: failed-from-file\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ONCEFLOW_PLUGINS_COUPON_GRANTER_GRANTED_TOPIC", "from-env")
	t.Setenv("ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_DELAY", "800ms")
	t.Setenv("ONCEFLOW_PLUGINS_COUPON_GRANTER_SEED", "18446744073709551615")
	t.Setenv("ONCEFLOW_PLUGINS_COUPON_NOTIFIER_CHANNEL", "sms")
	s, err := LoadSetup(Source{File: file}, inbox.RegisteredPlugins())
	if err != nil {
		t.Fatal(err)
	}
	ps, err := s.Plugins(coupon.PluginName, "coupon-notifier")
	if err != nil {
		t.Fatal(err)
	}
	p, n := ps[0], ps[1]
	got, ok := p.Settings().(coupon.Config)
	if !ok {
		t.Fatalf("settings of type %T, want coupon.Config", p.Settings())
	}
	want := coupon.DefaultConfig()
	want.GrantedTopic, want.FailedTopic, want.StepDelay, want.Seed = "from-env", "failed-from-file", 800*time.Millisecond, 1<<64-1
	if got != want {
		t.Errorf("settings\n got %+v\nwant %+v", got, want)
	}
	if topics, err := p.WrittenTopics(); err != nil || strings.Join(topics, ",") != "from-env,failed-from-file" {
		t.Errorf("writes: %v %v, want from-env,failed-from-file", topics, err)
	}
	if fmt.Sprintf("%+v", n.Settings()) != "{Channel:sms}" {
		t.Errorf("coupon-notifier: settings %+v, want channel sms", n.Settings())
	}
}

package onceflow

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/settings"
)

// A bad plugin setting in the config file or the environment (a value out of its range, a
// key the plugin does not declare, a value of the wrong type, settings its Validate
// refuses together) makes `router run` refuse it as bad input, one line naming the key, and nothing
// connects: the database and the broker count the connections they are offered.
func TestPluginSettingsRefusedBeforeConnecting(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, env, value string
		want                   []string
	}{
		{name: "rate out of range in the file", yaml: "step_failure_rate: 1.5",
			want: []string{"plugins.coupon-granter.step_failure_rate 1.5 outside 0..0.99"}},
		{name: "unknown key in the file", yaml: "step_dely: 5ms",
			want: []string{"plugins.coupon-granter.step_dely is no setting of plugin coupon-granter", "did you mean plugins.coupon-granter.step_delay?"}},
		{name: "wrong type in the file", yaml: "shards: many", want: []string{"'plugins.coupon-granter.shards'", "int"}},
		{name: "settings refused together", yaml: "step_delay: 1s\n    downstream_url: http://127.0.0.1:8490",
			want: []string{"plugins.coupon-granter: coupon: step_delay, step_jitter and step_failure_rate simulate the downstream"}},
		{name: "rate out of range in the environment", env: "ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATE", value: "1.5",
			want: []string{"(env ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATE)", "plugins.coupon-granter.step_failure_rate 1.5 outside 0..0.99"}},
		{name: "unknown key in the environment", env: "ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_DELA", value: "5ms",
			want: []string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_DELA is no setting of plugin coupon-granter", "did you mean ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_DELAY?"}},
		{name: "the notifier's channel", yaml: "", env: "ONCEFLOW_PLUGINS_COUPON_NOTIFIER_CHANNEL", value: strings.Repeat("c", 33),
			want: []string{"plugins.coupon-notifier: notify: channel", "must be 1..32 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, dbConns := countingListener(t)
			broker, kafkaConns := countingListener(t)
			t.Setenv("ONCEFLOW_DB_DSN", "app@tcp("+db+")/shop")
			t.Setenv("ONCEFLOW_KAFKA_BROKERS", broker)
			t.Setenv("ONCEFLOW_ADMIN_LISTEN", "")
			file := ""
			if tc.yaml != "" {
				file = filepath.Join(t.TempDir(), "router.yaml")
				if err := os.WriteFile(file, []byte("plugins:\n  coupon-granter:\n    "+tc.yaml+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.env != "" {
				t.Setenv(tc.env, tc.value)
			}
			err := runRouter(context.Background(), file, "run")
			if err == nil || !isBadInput(err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("router run: %v (bad input: %t), want bad input with one line", err, isBadInput(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("router run: %q does not say %q", err, w)
				}
			}
			if d, k := dbConns.Load(), kafkaConns.Load(); d != 0 || k != 0 {
				t.Errorf("router run: %d connections to the database and %d to the broker before refusing it", d, k)
			}
		})
	}
}

// Every setting a bundled plugin declares has a meaning and, when it is a number or a
// duration, a range, as the framework's settings do; its default is within it.
func TestEveryPluginSettingIsDeclared(t *testing.T) {
	n := 0
	for _, p := range inbox.RegisteredPlugins() {
		if p.Settings == nil {
			continue
		}
		for _, s := range settings.List(p.Settings) {
			n++
			key := pluginKey(p.Name, s.Key)
			if strings.TrimSpace(s.Help) == "" {
				t.Errorf("%s has no help text", key)
			}
			numeric := isNumber(s.Default)
			if _, ok := s.Default.(uint64); ok {
				numeric = true
			}
			if numeric != s.HasRange {
				t.Errorf("%s: numeric or duration %t, has a range %t", key, numeric, s.HasRange)
			}
		}
		v := reflect.New(reflect.TypeOf(p.Settings)).Interface()
		settings.SetDefaults(v)
		if err := settings.Check(v); err != nil {
			t.Errorf("plugin %s: the defaults are out of their own ranges: %v", p.Name, err)
		}
	}
	if n == 0 {
		t.Fatal("no bundled plugin declares a setting")
	}
}

// The decoded settings: every setting at its default where the section leaves it out, a
// value of the declared type (a pointer for a pointer, nested sections too), a configured 0
// kept, and a plugin without settings refusing any key but the reserved ones.
func TestDecodeSettings(t *testing.T) {
	type tls struct {
		CAFile string `key:"ca_file" help:"ca"`
	}
	type own struct {
		Topic   string        `key:"topic" default:"out" help:"topic"`
		Limit   int           `key:"limit" default:"10" range:"0..100" help:"limit"`
		Wait    time.Duration `key:"wait" default:"1s" range:"0..1m" help:"wait"`
		Servers []string      `key:"servers" default:"a,b,c" help:"servers"`
		TLS     tls           `key:"tls"`
	}
	build := func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return nil, nil }
	decl := inbox.Plugin{Name: "p", Topics: []string{"in"}, ConsumerGroup: "g", BizType: "b", Build: build, Settings: own{}}

	got, err := resolveSection(decl, nil)
	if err != nil || !reflect.DeepEqual(got.settings, own{Topic: "out", Limit: 10, Wait: time.Second, Servers: []string{"a", "b", "c"}}) {
		t.Fatalf("no section: %+v (%v), want the defaults", got.settings, err)
	}
	section := map[string]any{"Limit": 0, "wait": "5ms", "servers": "x", "tls": map[string]any{"ca_file": "/ca.pem"},
		"topics": []any{"other"}, "consumer_group": "g2"}
	got, err = resolveSection(decl, section)
	want := own{Topic: "out", Limit: 0, Wait: 5 * time.Millisecond, Servers: []string{"x"}, TLS: tls{CAFile: "/ca.pem"}}
	if err != nil || !reflect.DeepEqual(got.settings, want) || got.Topics[0] != "other" || got.ConsumerGroup != "g2" {
		t.Fatalf("a section: %+v %v %s (%v), want %+v on topic other, group g2", got.settings, got.Topics, got.ConsumerGroup, err, want)
	}
	pointer := decl
	pointer.Settings = (*own)(nil)
	if got, err := resolveSection(pointer, map[string]any{"limit": 7}); err != nil || got.settings.(*own).Limit != 7 || got.settings.(*own).Topic != "out" {
		t.Fatalf("a pointer: %+v (%v)", got.settings, err)
	}
	for _, tc := range []struct {
		section map[string]any
		want    string
	}{
		{map[string]any{"limit": 101}, "plugins.p.limit 101 outside 0..100"},
		{map[string]any{"tls": map[string]any{"ca_fil": "x"}}, "plugins.p.tls.ca_fil is no setting of plugin p (did you mean plugins.p.tls.ca_file?)"},
		{map[string]any{"tls": "x"}, "plugins.p.tls is no setting of plugin p"},
		{map[string]any{"wait": 5}, "'plugins.p.wait' invalid duration 5"},
	} {
		if _, err := resolveSection(decl, tc.section); err == nil || !isBadInput(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want exit 2 with %q", tc.section, err, tc.want)
		}
	}
	none := decl
	none.Settings = nil
	if got, err := resolveSection(none, map[string]any{"topics": []any{"x"}}); err != nil || got.settings != nil {
		t.Errorf("no settings, a reserved key: %v %v", got.settings, err)
	}
	if _, err := resolveSection(none, map[string]any{"note": "x"}); err == nil || !strings.Contains(err.Error(), "plugins.p.note is no setting of plugin p (it has none)") {
		t.Errorf("no settings, a key: %v", err)
	}
}

// The plugin is handed the settings decoded once: its Build, its Writes and its HTTP
// command's Build get the same value, and Build gets it through New as through LoadSetup
// (the command line's way).
func TestPluginGetsItsSettings(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DB.DSN = "app@tcp(127.0.0.1:1)/shop"
	cfg.Plugins = map[string]map[string]any{coupon.PluginName: {"granted_topic": "g", "failed_topic": "f", "campaign_id": "c1"}}
	rt, err := New(cfg, []inbox.Plugin{coupon.Plugin()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := rt.plugins[0]
	s, ok := p.settings.(coupon.Config)
	if !ok || s.GrantedTopic != "g" || s.CampaignID != "c1" || s.ValueCents != 500 {
		t.Fatalf("settings %+v", p.settings)
	}
	if topics, err := p.WrittenTopics(); err != nil || strings.Join(topics, ",") != "g,f" {
		t.Fatalf("writes %v (%v)", topics, err)
	}
	cmds := commandPlugins(rt.plugins)
	if len(cmds) != 1 || !reflect.DeepEqual(cmds[0].settings, p.settings) {
		t.Fatalf("the command's settings: %+v", cmds)
	}
	cfg.Plugins[coupon.PluginName]["shards"] = 0
	if _, err := New(cfg, []inbox.Plugin{coupon.Plugin()}, nil); err == nil || !isBadInput(err) ||
		!strings.Contains(err.Error(), "config: plugins.coupon-granter.shards 0 outside 1..1024") {
		t.Fatalf("New with shards 0: %v, want exit 2 naming the key", err)
	}
}

package onceflow

import (
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/viper"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/internal/gcx"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestRouterDefaultsAreTheLibraries: each section of the router's default configuration,
// given to its library, is what the library fills in for a zero config — a program wired by
// hand and the router start from the same settings.
func TestRouterDefaultsAreTheLibraries(t *testing.T) {
	c := DefaultConfig()
	same := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s\n got %+v\nwant %+v", name, got, want)
		}
	}
	same("db.*", c.DB.Config.WithDefaults(), dbx.Config{}.WithDefaults())
	kc := c.kafkaConfig()
	kc.ClientID = "" // the router names its clients
	same("kafka.*", kc.WithDefaults(), kafkax.Config{}.WithDefaults())
	same("kafka.window, kafka.max_in_flight_bytes", c.Kafka.Parallel.WithDefaults(), kafkax.ParallelConfig{}.WithDefaults())
	same("inbox.*", c.inboxConfig("x", "", false).WithDefaults(), engine.Config{BizType: "x"}.WithDefaults())
	same("inbox.batch_*", c.Inbox.Batch.WithDefaults(), engine.BatchConfig{}.WithDefaults())
	same("inbox.cleanup_*", c.Inbox.Cleaner.WithDefaults(), engine.CleanerConfig{}.WithDefaults())
	same("http.* (the handler's)", c.HTTP.Config.WithDefaults(), httpcmd.Config{}.WithDefaults())
	rc, lib := c.Relay.RelayConfig.WithDefaults(), outbox.RelayConfig{}.WithDefaults()
	rc.Owner, lib.Owner = "", "" // host-pid-random
	same("relay.*", rc, lib)
	if c.HTTP.IdempotencyTTL != engine.DefaultCommandRetention || c.Runtime.GOGC != gcx.DefaultPercent {
		t.Errorf("http.idempotency_ttl %s (engine.DefaultCommandRetention %s), runtime.gogc %d (gcx.DefaultPercent %d)",
			c.HTTP.IdempotencyTTL, engine.DefaultCommandRetention, c.Runtime.GOGC, gcx.DefaultPercent)
	}
}

// DefaultConfig is every setting at its default: valid, what the router resolves with no
// file and no environment, and what an embedding program starts from.
func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.Relay.BatchSize != 10000 || c.Kafka.Parallel.Window != 1024 || c.Kafka.Parallel.MaxInFlightBytes != 64<<20 || !c.Relay.Enabled || c.Admin.Listen != "127.0.0.1:9464" {
		t.Fatalf("defaults: %+v", c)
	}
	loaded, err := LoadConfig("")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(loaded, c) {
		t.Fatalf("LoadConfig without file or environment\n got %+v\nwant %+v", loaded, c)
	}
}

// configs/router.yaml holds only what differs from the defaults: each key in it is a
// setting (the framework's, a bundled plugin's or a plugin's topics and consumer group),
// and its value is not the setting's default.
func TestRouterYAMLOnlyDiffers(t *testing.T) {
	const file = "configs/router.yaml"
	v := viper.New()
	v.SetConfigFile(file)
	if err := v.ReadInConfig(); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	framework := map[string]settings.Setting{}
	for _, s := range settings.List(Config{}) {
		framework[s.Key] = s
	}
	plugins := map[string]inbox.Plugin{}
	for _, p := range inbox.RegisteredPlugins() {
		plugins[p.Name] = p
	}
	keys := v.AllKeys()
	if len(keys) == 0 {
		t.Fatalf("%s sets nothing", file)
	}
	for _, key := range keys {
		if s, ok := framework[key]; ok {
			if got := s.Get(cfg); reflect.DeepEqual(got, s.Default) {
				t.Errorf("%s: %s is %v, its default", file, key, settings.Text(got))
			}
			continue
		}
		name, own, _ := strings.Cut(strings.TrimPrefix(key, "plugins."), ".")
		p, ok := plugins[name]
		if !strings.HasPrefix(key, "plugins.") || !ok {
			t.Errorf("%s: %s is no setting", file, key)
			continue
		}
		r, err := resolvePlugin(p, cfg.Plugins[name])
		if err != nil {
			t.Fatal(err)
		}
		switch own {
		case keyTopics:
			if reflect.DeepEqual(r.Topics, p.Topics) {
				t.Errorf("%s: %s is the plugin's own topics", file, key)
			}
			continue
		case keyConsumerGroup:
			if r.ConsumerGroup == p.ConsumerGroup {
				t.Errorf("%s: %s is the plugin's own group", file, key)
			}
			continue
		}
		found := false
		if p.Settings != nil {
			for _, s := range settings.List(p.Settings) {
				if s.Key == own {
					found = true
					if got := s.Get(r.settings); reflect.DeepEqual(got, s.Default) {
						t.Errorf("%s: %s is %v, its default", file, key, settings.Text(got))
					}
				}
			}
		}
		if !found {
			t.Errorf("%s: %s is no setting of plugin %s", file, key, name)
		}
	}
}

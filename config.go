package onceflow

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/internal/gcx"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Config is the router configuration. Flags win over the ONCEFLOW_ environment variables,
// which win over the config file, which wins over the defaults. Each section embeds the
// configs of the libraries it sets, such as dbx.Config, kafkax.Config and engine.Config. It
// adds the runtime's own settings. Tags on each setting's field declare its key, default,
// range and help. Package internal/settings reads them to set the defaults, to check the
// ranges and to write README's configuration table.
type Config struct {
	DB      DBConfig      `key:"db"`
	Kafka   KafkaConfig   `key:"kafka"`
	Inbox   InboxConfig   `key:"inbox"`
	Relay   RelayConfig   `key:"relay"`
	Admin   AdminConfig   `key:"admin"`
	HTTP    HTTPConfig    `key:"http"`
	Otel    OtelConfig    `key:"otel"`
	Log     LogConfig     `key:"log"`
	Runtime RuntimeConfig `key:"runtime"`
	// Plugins holds one section per plugin, plugins.<name>. Its reserved keys are topics, a
	// list, and consumer_group. They override the plugin's declaration for this deployment.
	// The other keys are the plugin's own settings, which inbox.Plugin.Settings declares.
	// LoadConfig and New decode and check them.
	Plugins map[string]map[string]any `key:"plugins"`

	tracing trace.TracerProvider // built from Otel by startTracing, nil when nothing is traced
}

// DBConfig is db.*. Its dbx.Config configures the application pool, with dsn, password,
// max_open_conns and tls. DBConfig adds the files of the secrets and the privileged DSN of
// `migrate`.
type DBConfig struct {
	dbx.Config        `key:",squash"`
	PasswordFile      string `key:"password_file" after:"password" help:"file whose first line is db.password"`
	AdminDSN          string `key:"admin_dsn" after:"dsn" help:"privileged DSN used by \x60migrate\x60 only; required there"`
	AdminPassword     string `key:"admin_password" after:"password_file" help:"password of db.admin_dsn's user, replacing the DSN's; better from ONCEFLOW_DB_ADMIN_PASSWORD or db.admin_password_file"`
	AdminPasswordFile string `key:"admin_password_file" after:"admin_password" help:"file whose first line is db.admin_password"`
}

// KafkaConfig is kafka.*. It holds the clients' kafkax.Config, and the parallel
// subscriber's window and byte budget.
type KafkaConfig struct {
	kafkax.Config `key:",squash"`
	Parallel      kafkax.ParallelConfig `key:",squash"`
}

// InboxConfig is inbox.*. It configures every plugin's inbox, to which the runtime adds the
// plugin's biz type. It also configures group commit and the cleaner.
type InboxConfig struct {
	engine.Config `key:",squash"`
	// BreakerEnabled is the opposite of engine.Config.BreakerOff, as the settings list it.
	BreakerEnabled bool                 `key:"breaker_enabled" default:"true" after:"delayed_backoff_max" help:"circuit breaker per plugin: when nearly every attempt fails (breaker_failure_ratio of at least breaker_min_calls in 10 s) its deliveries wait, spending no attempt, until a probe succeeds"`
	Batch          engine.BatchConfig   `key:",squash"`
	Cleaner        engine.CleanerConfig `key:",squash"`
}

// RelayConfig is relay.*. It says whether and how this process relays, and holds the
// relay's own outbox.RelayConfig.
type RelayConfig struct {
	Enabled            bool `key:"enabled" default:"true" help:"run the outbox relay in this process"`
	ExactlyOnce        bool `key:"exactly_once" default:"true" after:"lag_bound" help:"transactional producer + positions topic + lease; false: idempotent producer, at least once"`
	outbox.RelayConfig `key:",squash"`
	CheckTopics        bool `key:"check_topics" default:"true" help:"\x60run\x60 exits 1 at start when a topic its plugins write to does not exist (false: their events are parked until it does)"`
}

// AdminConfig is admin.*, the listener of /healthz, /readyz, /metrics and the operator
// console.
type AdminConfig struct {
	Listen    string `key:"listen" default:"127.0.0.1:9464" help:"/healthz, /readyz and /metrics listener (empty disables); an address beyond loopback requires admin.token"`
	Token     string `key:"token" help:"bearer token /metrics and /readyz ask for (Authorization: Bearer …), at least 16 characters; better from ONCEFLOW_ADMIN_TOKEN or admin.token_file"`
	TokenFile string `key:"token_file" help:"file whose first line is admin.token"`
	// Pprof serves the profiles of net/http/pprof under /debug/pprof/ on the admin
	// listener. They are the router's own CPU and allocation profiles. admin.token guards
	// them as it guards /metrics.
	Pprof bool `key:"pprof" default:"false" help:"serve Go's runtime profiles at /debug/pprof/ on the admin listener (behind admin.token like /metrics)"`
}

// HTTPConfig is http.*. It configures the listener of the plugins' HTTP commands, which
// inbox.Command declares, and the handler's httpcmd.Config. It also says how long a client
// token is kept.
type HTTPConfig struct {
	Listen         string `key:"listen" help:"listener of the plugins' HTTP commands (e.g. POST /v1/claims with an Idempotency-Key); empty (the default) disables; an address beyond loopback requires http.token"`
	Token          string `key:"token" help:"bearer token the commands ask for (Authorization: Bearer …), at least 16 characters; better from ONCEFLOW_HTTP_TOKEN or http.token_file"`
	TokenFile      string `key:"token_file" help:"file whose first line is http.token"`
	httpcmd.Config `key:",squash"`
	// IdempotencyTTL is the command inboxes' engine.Config.Retention, within its range.
	IdempotencyTTL time.Duration `key:"idempotency_ttl" default:"24h" range:"1h..87600h" help:"how long a client token (Idempotency-Key) and its response are kept; the inbox cleaner removes them after"`
}

// RuntimeConfig is runtime.*, the Go garbage collector's settings for this process. Package
// internal/gcx applies them. GOGC and GOMEMLIMIT in the environment win over them.
type RuntimeConfig struct {
	GOGC          int `key:"gogc" default:"100" range:"-1..100000" help:"Go GC target percentage (GOGC; the environment's GOGC wins); -1 off, with runtime.memory_limit_mb. Higher trades memory for fewer collections: see docs/BENCHMARKS.md, Why the defaults"`
	MemoryLimitMB int `key:"memory_limit_mb" range:"0..1073741824" help:"Go soft memory limit in MiB (GOMEMLIMIT; the environment's wins); 0: none. Set it in a memory-limited container so the collector works harder before the limit"`
}

// LogConfig is log.*.
type LogConfig struct {
	Level  string `key:"level" default:"info" help:"debug, info, warn, error (slog through Watermill's adapter)"`
	Format string `key:"format" default:"text" help:"text or json"`
}

// configTable renders the settings as README's configuration table. The table is markdown,
// with the columns key, environment variable, default and meaning. The framework's settings
// come first. The settings the plugins declare follow as plugins.<name>.<key>, in the order
// given. `go test . -run TestConfigTable -update` writes the table into README with the
// bundled plugins.
func configTable(plugins []inbox.Plugin) string {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	var b strings.Builder
	b.WriteString("| key | env | default | meaning |\n|---|---|---|---|\n")
	row := func(key string, s settings.Setting) {
		def := "—"
		if t := settings.Text(s.Default); t != "" {
			def = "`" + t + "`"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", key, envName(key), cell(def), cell(s.Help))
	}
	for _, s := range settings.List(Config{}) {
		row(s.Key, s)
	}
	for _, p := range plugins {
		if p.Settings != nil {
			for _, s := range settings.List(p.Settings) {
				row(pluginKey(p.Name, s.Key), s)
			}
		}
	}
	return b.String()
}

// pluginKey is the configuration key of a plugin's setting, plugins.<name>.<key>.
func pluginKey(plugin, key string) string { return "plugins." + plugin + "." + key }

// DefaultConfig is the configuration with every key at its default. It reads no file and no
// environment. A program that embeds the runtime starts from it.
func DefaultConfig() Config {
	var c Config
	settings.SetDefaults(&c)
	return c
}

// LoadConfig resolves the configuration as the router binary does without flags. The
// ONCEFLOW_ environment variables win over file, which wins over the defaults. An empty
// file stands for the one $ONCEFLOW_CONFIG names, else configs/router.yaml if present.
// Unknown keys, invalid values and ONCEFLOW_ variables that name no setting are bad input,
// matching ErrBadInput. That includes the settings of the plugins registered with
// inbox.MustRegister.
func LoadConfig(file string) (Config, error) {
	cfg, _, err := loadConfig(file, nil, nil, inbox.RegisteredPlugins())
	return cfg, err
}

// decodeConfig decodes v into the sections' fields by their key tags. A field without a key
// tag is no setting. A key that names no setting is an error.
func decodeConfig(v *viper.Viper) (Config, error) {
	var cfg Config
	err := v.UnmarshalExact(&cfg, func(dc *mapstructure.DecoderConfig) {
		dc.TagName = "key"
		dc.IgnoreUntaggedFields = true
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(strictDuration, mapstructure.StringToSliceHookFunc(","))
	})
	settings.Resolve(&cfg) // a configured 0 that means "off", as for relay.linger, relay.retention and inbox.batch_linger
	return cfg, err
}

// defaultConfigFile is the config file read when none is named, if it exists. Its path is
// relative to the working directory. The package's tests run at the repository root, so
// they clear it.
var defaultConfigFile = "configs/router.yaml"

// configFile is the config file the configuration is read from. It is file, which --config
// gives, else $ONCEFLOW_CONFIG, else defaultConfigFile if it exists. It is "" for none.
func configFile(file string) string {
	if file == "" {
		file = os.Getenv(configEnv)
	}
	if file == "" {
		if _, err := os.Stat(defaultConfigFile); err == nil {
			file = defaultConfigFile
		}
	}
	return file
}

// loadConfig resolves the configuration. configFile resolves an empty file. Unknown keys
// are errors. So are the ONCEFLOW_ variables the router does not read, which checkEnv
// finds. plugins are the binary's plugins. loadConfig reads their settings from their
// sections and from their variables, ONCEFLOW_PLUGINS_<NAME>_<KEY>, and checks them. It
// reports every plugin's refusals together. It leaves the sections of other plugins to the
// commands that run plugins, which call Setup.CheckSections.
func loadConfig(file string, flags *pflag.FlagSet, bind map[string]string, plugins []inbox.Plugin) (Config, *viper.Viper, error) {
	environ := os.Environ()
	known := settingEnv(plugins)
	if err := checkEnv(environ, known, plugins); err != nil {
		return Config{}, nil, err
	}
	v := viper.New()
	for _, s := range settings.List(Config{}) {
		v.SetDefault(s.Key, s.Default)
	}
	v.SetEnvPrefix(strings.TrimSuffix(envPrefix, "_"))
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_", "-", "_"))
	v.AutomaticEnv()
	for name, key := range known {
		if strings.HasPrefix(key, "plugins.") {
			// A plugin's setting has no default here. So an unset variable leaves it out of
			// the section, and decodeSettings gives it its default.
			if err := v.BindEnv(key, name); err != nil {
				return Config{}, nil, err
			}
		}
	}
	file = configFile(file)
	if file != "" {
		if st, err := os.Stat(file); err == nil && st.IsDir() {
			return Config{}, nil, BadInput(fmt.Errorf("config file %s is a directory: name a .yaml file", file))
		}
		switch strings.ToLower(filepath.Ext(file)) {
		case ".yaml", ".yml", ".json", ".toml":
		default:
			return Config{}, nil, BadInput(fmt.Errorf("config file %s: unknown type %q (name a .yaml, .yml, .json or .toml file)", file, filepath.Ext(file)))
		}
		v.SetConfigFile(file)
		if err := v.ReadInConfig(); err != nil {
			return Config{}, nil, BadInput(fmt.Errorf("config file %s: %s", file, oneLine(err)))
		}
	}
	for key, flag := range bind {
		if f := flags.Lookup(flag); f != nil {
			if err := v.BindPFlag(key, f); err != nil {
				return Config{}, nil, err
			}
		}
	}
	cfg, err := decodeConfig(v)
	if err != nil {
		return Config{}, nil, configError(errors.New(oneLine(err)), file, environ, known, flags, bind)
	}
	var refused refusals
	if err := cfg.validate(); err != nil {
		refused = append(refused, err)
	}
	for _, p := range plugins {
		if _, err := resolveSection(p, cfg.Plugins[p.Name]); err != nil {
			refused = append(refused, err) // configError marks the whole as bad input
		}
	}
	if len(refused) > 0 {
		return Config{}, nil, configError(refused, file, environ, known, flags, bind)
	}
	return cfg, v, nil
}

// refusals are the reasons a configuration is refused, reported on one line.
type refusals []error

func (r refusals) Error() string {
	msgs := make([]string, len(r))
	for i, err := range r {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (r refusals) Unwrap() []error { return r }

// strictDuration parses durations and says which value was wrong.
func strictDuration(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeOf(time.Duration(0)) {
		return data, nil
	}
	switch d := data.(type) {
	case string:
		dur, err := time.ParseDuration(d)
		if err != nil {
			return nil, fmt.Errorf("invalid duration %q (use e.g. 500ms, 10s, 720h)", d)
		}
		return dur, nil
	case int, int64, float64:
		return nil, fmt.Errorf("invalid duration %v: give a unit (e.g. 10s)", d)
	}
	return data, nil
}

// validate checks everything that can be checked before anything connects. It first checks
// every setting's range, with an error line naming the key, its value and the range. It
// then runs each library's own check of the config the runtime builds from these settings.
// Those check the same ranges. They also check the settings that relate to each other, such
// as backoff, heartbeat and linger. validate checks the runtime's own sections last.
func (c Config) validate() error {
	if err := settings.Check(c); err != nil {
		return err
	}
	// No DSN is built in. The commands that connect refuse an empty db.dsn in
	// Setup.DBConfig, as bad input naming the key. The commands that do not connect, such
	// as plugins and config, run without one.
	if c.DB.DSN != "" {
		if _, err := dbx.ParseDSNInfo(c.DB.DSN); err != nil {
			return fmt.Errorf("db.dsn: %w", err)
		}
	}
	if err := c.DB.validate(); err != nil {
		return err
	}
	if len(c.Kafka.Brokers) == 0 {
		return errors.New("kafka.brokers is empty")
	}
	if !c.Relay.ExactlyOnce && c.Relay.Shards > 1 {
		return fmt.Errorf("relay.shards %d needs relay.exactly_once: the at-least-once relay publishes one shard", c.Relay.Shards)
	}
	// The inbox settings are the same for every plugin but the biz type, so they are
	// checked once here.
	kc := c.kafkaConfig()
	for _, err := range []error{
		c.DB.Config.WithDefaults().Validate(),
		kc.Validate(),
		c.parallelConfig(nil).WithDefaults().Validate(),
		c.inboxConfig("probe", "", false).WithDefaults().Validate(),
		c.inboxConfig("probe", "", true).WithDefaults().Validate(),
		c.Inbox.Batch.WithDefaults().Validate(),
		c.cleanerConfig().WithDefaults().Validate(),
		c.Relay.RelayConfig.WithDefaults().Validate(),
		c.HTTP.Config.WithDefaults().Validate(),
	} {
		if err != nil {
			return err
		}
	}
	if err := c.Admin.validate(); err != nil {
		return err
	}
	if err := c.HTTP.validate(); err != nil {
		return err
	}
	if err := c.Otel.validate(); err != nil {
		return err
	}
	if err := gcx.Validate(c.Runtime.GOGC, c.Runtime.MemoryLimitMB); err != nil {
		return err
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log.level %q: use debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		return fmt.Errorf("log.format %q: use text or json", c.Log.Format)
	}
	return nil
}

// inboxConfig is one plugin's inbox config, which is inbox.* with the plugin's biz type.
// With command, the inbox is an HTTP command's, and its rows are kept for
// http.idempotency_ttl.
func (c Config) inboxConfig(bizType, keyLogField string, command bool) engine.Config {
	ic := c.Inbox.Config
	ic.BizType, ic.KeyLogField, ic.TracerProvider = bizType, keyLogField, c.tracing
	ic.BreakerOff = !c.Inbox.BreakerEnabled
	if command {
		ic.Retention = c.HTTP.IdempotencyTTL
	}
	return ic
}

// cleanerConfig is the inbox cleaner's config of inbox.cleanup_*. The cleaner also deletes
// the stored responses of HTTP commands with their rows.
func (c Config) cleanerConfig() engine.CleanerConfig {
	cc := c.Inbox.Cleaner
	cc.Replies = true
	return cc
}

// kafkaConfig is the Kafka clients' config. It is kafka.* under the router's client id,
// with defaults for the settings left zero.
func (c Config) kafkaConfig() kafkax.Config {
	kc := c.Kafka.Config
	kc.ClientID = "onceflow-router"
	return kc.WithDefaults()
}

// parallelConfig is a parallel subscriber's config. It holds kafka.window and budget, the
// router's one byte budget of kafka.max_in_flight_bytes. Values over
// inbox.max_payload_bytes are cut before they wait.
func (c Config) parallelConfig(budget *kafkax.Budget) kafkax.ParallelConfig {
	pc := c.Kafka.Parallel
	pc.Budget, pc.MaxValueBytes = budget, c.Inbox.MaxPayloadBytes
	return pc
}

// oneLine flattens mapstructure's multi-line error report into one line.
func oneLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), "decoding failed due to the following error(s):", "")
	var parts []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

// validate checks the db section's secrets and TLS. Each password has one source at most,
// and the files must be readable.
func (c DBConfig) validate() error {
	if _, err := c.password(false); err != nil {
		return err
	}
	if _, err := c.password(true); err != nil {
		return err
	}
	if c.TLS.Enabled() {
		if _, err := c.TLS.Config(); err != nil {
			return err
		}
	}
	return nil
}

// password is db.password or the first line of db.password_file. With admin, it is
// db.admin_password or the first line of db.admin_password_file. An empty password leaves
// the DSN's own.
func (c DBConfig) password(admin bool) (string, error) {
	key, pw, file := "db.password", c.Password, c.PasswordFile
	if admin {
		key, pw, file = "db.admin_password", c.AdminPassword, c.AdminPasswordFile
	}
	if file == "" {
		return pw, nil
	}
	if pw != "" {
		return "", fmt.Errorf("%s and %s_file: set one, not both", key, key)
	}
	return dbx.ReadSecretFile(key+"_file", file)
}

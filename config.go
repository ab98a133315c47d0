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
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/internal/gcx"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Config is the router configuration: flags > env (ONCEFLOW_*) > config file > defaults.
type Config struct {
	DB      DBConfig      `mapstructure:"db"`
	Kafka   KafkaConfig   `mapstructure:"kafka"`
	Inbox   InboxConfig   `mapstructure:"inbox"`
	Relay   RelayConfig   `mapstructure:"relay"`
	Admin   AdminConfig   `mapstructure:"admin"`
	HTTP    HTTPConfig    `mapstructure:"http"`
	Log     LogConfig     `mapstructure:"log"`
	Otel    OtelConfig    `mapstructure:"otel"`
	Runtime RuntimeConfig `mapstructure:"runtime"`
	// Plugins holds one section per plugin, plugins.<name>: the reserved keys topics (a list)
	// and consumer_group override the plugin's declaration for this deployment; the other
	// keys are the plugin's own settings (inbox.PluginEnv.DecodeConfig).
	Plugins map[string]map[string]any `mapstructure:"plugins"`

	tracing trace.TracerProvider // built from Otel by startTracing; nil: nothing is traced
}

type DBConfig struct {
	DSN               string      `mapstructure:"dsn"`
	AdminDSN          string      `mapstructure:"admin_dsn"`
	Password          string      `mapstructure:"password"`
	PasswordFile      string      `mapstructure:"password_file"`
	AdminPassword     string      `mapstructure:"admin_password"`
	AdminPasswordFile string      `mapstructure:"admin_password_file"`
	MaxOpenConns      int         `mapstructure:"max_open_conns"`
	TLS               DBTLSConfig `mapstructure:"tls"`
}

// DBTLSConfig is TLS to the database server: any key set turns it on, always verified.
type DBTLSConfig struct {
	CAFile     string `mapstructure:"ca_file"`
	CertFile   string `mapstructure:"cert_file"`
	KeyFile    string `mapstructure:"key_file"`
	ServerName string `mapstructure:"server_name"`
}

type KafkaConfig struct {
	Brokers          []string        `mapstructure:"brokers"`
	SessionTimeout   time.Duration   `mapstructure:"session_timeout"`
	RebalanceTimeout time.Duration   `mapstructure:"rebalance_timeout"`
	Heartbeat        time.Duration   `mapstructure:"heartbeat"`
	MaxPollWait      time.Duration   `mapstructure:"max_poll_wait"`
	Window           int             `mapstructure:"window"`
	MaxInFlightBytes int             `mapstructure:"max_in_flight_bytes"`
	TLS              KafkaTLSConfig  `mapstructure:"tls"`
	SASL             KafkaSASLConfig `mapstructure:"sasl"`
}

type KafkaTLSConfig struct {
	Enabled            bool   `mapstructure:"enabled"`
	CAFile             string `mapstructure:"ca_file"`
	CertFile           string `mapstructure:"cert_file"`
	KeyFile            string `mapstructure:"key_file"`
	ServerName         string `mapstructure:"server_name"`
	InsecureSkipVerify bool   `mapstructure:"insecure_skip_verify"`
}

type KafkaSASLConfig struct {
	Mechanism    string `mapstructure:"mechanism"`
	User         string `mapstructure:"user"`
	Password     string `mapstructure:"password"`
	PasswordFile string `mapstructure:"password_file"`
}

type InboxConfig struct {
	MaxAttempts      int           `mapstructure:"max_attempts"`
	BackoffInitial   time.Duration `mapstructure:"backoff_initial"`
	BackoffMax       time.Duration `mapstructure:"backoff_max"`
	Retention        time.Duration `mapstructure:"retention"`
	MaxPayloadBytes  int           `mapstructure:"max_payload_bytes"`
	MaxMetadataBytes int           `mapstructure:"max_metadata_bytes"`
	HandlerTimeout   time.Duration `mapstructure:"handler_timeout"`
	StepsPerTx       int           `mapstructure:"steps_per_transaction"`
	BatchSize        int           `mapstructure:"batch_size"`
	BatchLinger      time.Duration `mapstructure:"batch_linger"`
	BatchWorkers     int           `mapstructure:"batch_workers"`
	MaxInFlightCalls int           `mapstructure:"max_in_flight_calls"`
	CleanupInterval  time.Duration `mapstructure:"cleanup_interval"`
	CleanupBatch     int           `mapstructure:"cleanup_batch"`
}

type RelayConfig struct {
	Enabled         bool          `mapstructure:"enabled"`
	BatchSize       int           `mapstructure:"batch_size"`
	PollInterval    time.Duration `mapstructure:"poll_interval"`
	Linger          time.Duration `mapstructure:"linger"`
	LagBound        time.Duration `mapstructure:"lag_bound"`
	ExactlyOnce     bool          `mapstructure:"exactly_once"`
	Shard           string        `mapstructure:"shard"`
	Shards          int           `mapstructure:"shards"`
	TransactionalID string        `mapstructure:"transactional_id"`
	PositionsTopic  string        `mapstructure:"positions_topic"`
	PositionsMinRF  int           `mapstructure:"positions_min_replicas"`
	Owner           string        `mapstructure:"owner"`
	LeaseTTL        time.Duration `mapstructure:"lease_ttl"`
	TxnTimeout      time.Duration `mapstructure:"txn_timeout"`
	RetryBackoff    time.Duration `mapstructure:"retry_backoff"`
	MaxRetryBackoff time.Duration `mapstructure:"max_retry_backoff"`
	Retention       time.Duration `mapstructure:"retention"`
	CleanupInterval time.Duration `mapstructure:"cleanup_interval"`
	CleanupBatch    int           `mapstructure:"cleanup_batch"`
	CheckTopics     bool          `mapstructure:"check_topics"`
}

type AdminConfig struct {
	Listen    string `mapstructure:"listen"`
	Token     string `mapstructure:"token"`
	TokenFile string `mapstructure:"token_file"`
}

// HTTPConfig is the listener of the plugins' HTTP commands (inbox.Command).
type HTTPConfig struct {
	Listen         string        `mapstructure:"listen"`
	Token          string        `mapstructure:"token"`
	TokenFile      string        `mapstructure:"token_file"`
	MaxBodyBytes   int           `mapstructure:"max_body_bytes"`
	RequestTimeout time.Duration `mapstructure:"request_timeout"`
	OutcomeWait    time.Duration `mapstructure:"outcome_wait"`
	IdempotencyTTL time.Duration `mapstructure:"idempotency_ttl"`
}

// RuntimeConfig is the Go garbage collector's setting for this process (internal/gcx); GOGC and
// GOMEMLIMIT in the environment win over it.
type RuntimeConfig struct {
	GOGC          int `mapstructure:"gogc"`
	MemoryLimitMB int `mapstructure:"memory_limit_mb"`
}

type LogConfig struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
}

// The libraries' defaults, read from the packages themselves: a setting the router shares
// with a library has the library's default, so a program wired by hand and the stock router
// start from the same values.
var (
	libDB       = dbx.Config{}.WithDefaults()
	libKafka    = kafkax.Config{}.WithDefaults()
	libParallel = kafkax.ParallelConfig{}.WithDefaults()
	libInbox    = inbox.Config{}.WithDefaults()
	libBatch    = inbox.BatchConfig{}.WithDefaults()
	libCleaner  = inbox.CleanerConfig{}.WithDefaults()
	libRelay    = outbox.RelayConfig{}.WithDefaults()
	libHTTP     = httpcmd.Config{}.WithDefaults()
)

// dur is d as a settings value: "100ms", "1m", "720h" (time.Duration's text without its
// trailing zero units).
func dur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// defaults is the single table of configuration keys, their defaults and what they mean:
// the router and DefaultConfig take their defaults from it (those it shares with a library
// from the library: libInbox, libRelay, …), and README's configuration table is its
// rendering (configTable; TestConfigTable fails when they differ).
var defaults = []struct {
	key   string
	value any
	help  string
}{
	{"db.dsn", "", "application DSN (least privilege), user@tcp(host:port)/db; required (no built-in credentials)"},
	{"db.admin_dsn", "", "privileged DSN used by `migrate` only; required there"},
	{"db.password", "", "password of db.dsn's user, replacing the DSN's; better from ONCEFLOW_DB_PASSWORD or db.password_file"},
	{"db.password_file", "", "file whose first line is db.password"},
	{"db.admin_password", "", "password of db.admin_dsn's user, replacing the DSN's; better from ONCEFLOW_DB_ADMIN_PASSWORD or db.admin_password_file"},
	{"db.admin_password_file", "", "file whose first line is db.admin_password"},
	{"db.max_open_conns", libDB.MaxOpenConns, "connection pool size"},
	{"db.tls.ca_file", "", "TLS to the database (any db.tls.* key turns it on, always verified): PEM CA certificates the server's must chain to (empty: the system's)"},
	{"db.tls.cert_file", "", "PEM client certificate, for servers that ask for one (with db.tls.key_file)"},
	{"db.tls.key_file", "", "PEM private key of db.tls.cert_file"},
	{"db.tls.server_name", "", "name the server's certificate must carry (empty: the DSN's host)"},
	{"kafka.brokers", libKafka.Brokers, "bootstrap brokers"},
	{"kafka.tls.enabled", false, "TLS to the brokers (every client: consumer, relay producer, admin, readback, probe)"},
	{"kafka.tls.ca_file", "", "PEM CA certificates the brokers' must chain to (empty: the system's)"},
	{"kafka.tls.cert_file", "", "PEM client certificate, for brokers that ask for one (with kafka.tls.key_file)"},
	{"kafka.tls.key_file", "", "PEM private key of kafka.tls.cert_file"},
	{"kafka.tls.server_name", "", "name the brokers' certificates must carry (empty: each broker's host)"},
	{"kafka.tls.insecure_skip_verify", false, "accept any broker certificate (a throw-away test broker only)"},
	{"kafka.sasl.mechanism", "", "SASL authentication: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: none)"},
	{"kafka.sasl.user", "", "SASL user"},
	{"kafka.sasl.password", "", "SASL password; better from ONCEFLOW_KAFKA_SASL_PASSWORD or kafka.sasl.password_file"},
	{"kafka.sasl.password_file", "", "file whose first line is the SASL password (read again at each client start)"},
	{"kafka.session_timeout", dur(libKafka.SessionTimeout), "consumer group session timeout"},
	{"kafka.rebalance_timeout", dur(libKafka.RebalanceTimeout), "time a member has to rejoin during a rebalance"},
	{"kafka.heartbeat", dur(libKafka.HeartbeatEvery), "consumer heartbeat interval"},
	{"kafka.max_poll_wait", dur(libKafka.MaxPollWait), "fetch max wait"},
	{"kafka.window", libParallel.Window, "most un-acked messages handed out per partition at once (per-key order kept; offsets committed only past acked messages; a crash redelivers at most this many per partition); 1: watermill-kafka's one-at-a-time subscriber"},
	{"kafka.max_in_flight_bytes", int(libParallel.MaxInFlightBytes), "one budget for the router: bytes of the records handed out and not acked (value, key, headers and 8 KiB each), so many small records wait on slow calls while few big ones do; a value over inbox.max_payload_bytes waits cut to its quarantine form"},
	{"inbox.max_attempts", libInbox.MaxAttempts, "handler attempts before a message is quarantined"},
	{"inbox.backoff_initial", dur(libInbox.BackoffInitial), "first retry backoff (doubles)"},
	{"inbox.backoff_max", dur(libInbox.BackoffMax), "retry backoff cap"},
	{"inbox.retention", dur(libInbox.Retention), "inbox rows expire after this (30 days); must cover how far back Kafka can replay: a warning is logged at start when a topic keeps messages longer"},
	{"inbox.max_payload_bytes", libInbox.MaxPayloadBytes, "larger payloads are poison (quarantined with a 64 KiB prefix, size and sha256); checked against the server's max_allowed_packet at start"},
	{"inbox.max_metadata_bytes", libInbox.MaxMetadataBytes, "records whose headers (as JSON) are longer are poison (stored capped); at most 65535"},
	{"inbox.handler_timeout", dur(libInbox.HandlerTimeout), "a plugin call (prepare, handle) that has not returned by then is abandoned and counts as a failed attempt (reason timeout)"},
	{"inbox.steps_per_transaction", libInbox.StepsPerTx, "consecutive handler steps per transaction; 1: every state transition commits alone (no lock held across the next step's slow call); 3: a whole coupon grant in one commit, same guarantees"},
	{"inbox.batch_size", libBatch.MaxSize, "group commit: deliveries per transaction (a BatchHandler's own multi-row path, else a plain handler's deliveries behind savepoints); 1 turns it off"},
	{"inbox.batch_linger", dur(libBatch.Linger), "how long a batch waits for more deliveries after its first"},
	{"inbox.batch_workers", libBatch.Workers, "batch transactions running at once (a second only for a full batch or one that waited 2× batch_linger; never two with one key)"},
	{"inbox.max_in_flight_calls", libInbox.MaxInFlightCalls, "outside calls (a plugin's Prepare, or its PrepareDelivery under group commit, each prepared as soon as the delivery arrives) running at once; calls in flight ÷ call time bounds the throughput of slow calls"},
	{"inbox.cleanup_interval", dur(libCleaner.Interval), "how often expired done rows are deleted"},
	{"inbox.cleanup_batch", libCleaner.BatchSize, "rows per cleanup DELETE"},
	{"relay.enabled", true, "run the outbox relay in this process"},
	{"relay.batch_size", libRelay.BatchSize, "events per Kafka transaction (larger: fewer commits, more republished after an abort; docs/BENCHMARKS.md, Why the defaults)"},
	{"relay.poll_interval", dur(libRelay.PollInterval), "relay sleep when nothing is pending"},
	{"relay.linger", dur(libRelay.Linger), "a partial batch waits this long once for more rows before it is published (as Kafka's linger.ms); 0 publishes at once"},
	{"relay.lag_bound", dur(libRelay.LagBound), "verify: unpublished rows older than this are a violation"},
	{"relay.exactly_once", true, "transactional producer + positions topic + lease; false: idempotent producer, at least once"},
	{"relay.shard", libRelay.Shard, "shard group of the outbox (one lease and one transactional.id per shard)"},
	{"relay.shards", libRelay.Shards, "outbox shards (hash of the key mod shards): the group's relays spread them; change only with a drained outbox"},
	{"relay.transactional_id", "", "Kafka transactional.id (default onceflow-relay-<database>-<shard>, so two databases never share positions or fence each other); the same on every instance of the shard"},
	{"relay.positions_topic", libRelay.PositionsTopic, "compacted topic of batch positions (created if missing)"},
	{"relay.positions_min_replicas", libRelay.PositionsMinReplicas, "the relay refuses a positions topic with fewer replicas than this on a cluster of at least this many brokers (as many as it has on a smaller one); it creates a missing one with min(3, brokers) replicas, min.insync.replicas 2; 1 accepts any"},
	{"relay.owner", "", "lease owner name (default host-pid-random)"},
	{"relay.lease_ttl", dur(libRelay.LeaseTTL), "a crashed relay's shard is taken over after this"},
	{"relay.txn_timeout", dur(libRelay.TxnTimeout), "Kafka transaction timeout"},
	{"relay.retry_backoff", dur(libRelay.RetryBackoff), "first retry backoff after a failed batch (doubles)"},
	{"relay.max_retry_backoff", dur(libRelay.MaxRetryBackoff), "retry backoff cap"},
	{"relay.retention", dur(libRelay.Retention), "published outbox rows are deleted after this (0 keeps them)"},
	{"relay.cleanup_interval", dur(libRelay.CleanupInterval), "how often published rows past the retention are deleted"},
	{"relay.cleanup_batch", libRelay.CleanupBatch, "rows per cleanup DELETE"},
	{"relay.check_topics", true, "`run` exits 1 at start when a topic its plugins write to does not exist (false: their events are parked until it does)"},
	{"admin.listen", "127.0.0.1:9464", "/healthz, /readyz and /metrics listener (empty disables); an address beyond loopback requires admin.token"},
	{"admin.token", "", "bearer token /metrics and /readyz ask for (Authorization: Bearer …), at least 16 characters; better from ONCEFLOW_ADMIN_TOKEN or admin.token_file"},
	{"admin.token_file", "", "file whose first line is admin.token"},
	{"http.listen", "", "listener of the plugins' HTTP commands (e.g. POST /v1/claims with an Idempotency-Key); empty (the default) disables; an address beyond loopback requires http.token"},
	{"http.token", "", "bearer token the commands ask for (Authorization: Bearer …), at least 16 characters; better from ONCEFLOW_HTTP_TOKEN or http.token_file"},
	{"http.token_file", "", "file whose first line is http.token"},
	{"http.max_body_bytes", libHTTP.MaxBodyBytes, "a larger request body is refused (413)"},
	{"http.request_timeout", dur(libHTTP.RequestTimeout), "bound of one command request; a slower one answers 503 when nothing of it committed, else waits up to http.outcome_wait for its transaction"},
	{"http.outcome_wait", dur(libHTTP.OutcomeWait), "how much longer a request past http.request_timeout waits for the transaction it is part of (group commit); then it answers 504: outcome unknown, retry with the same Idempotency-Key"},
	{"http.idempotency_ttl", dur(inbox.DefaultCommandRetention), "how long a client token (Idempotency-Key) and its response are kept; the inbox cleaner removes them after"},
	{"otel.exporter", "none", "tracing: none (no span is created) or otlp (OpenTelemetry spans over OTLP/HTTP from `run` and `relay`: a delivery continues its record's traceparent header, the outbox keeps the trace, the relay writes it on the event; docs/ARCHITECTURE.md, Tracing)"},
	{"otel.endpoint", "", "OTLP/HTTP collector URL, e.g. http://127.0.0.1:4318 (/v1/traces added when it has no path; https: verified with the system's CAs); empty: the OTEL_EXPORTER_OTLP_* environment, else https://localhost:4318"},
	{"otel.sample_ratio", 1.0, "share of new traces recorded, 0..1; a record whose traceparent says sampled (or not) decides for its own trace"},
	{"log.level", "info", "debug, info, warn, error (slog through Watermill's adapter)"},
	{"log.format", "text", "text or json"},
	{"runtime.gogc", gcx.DefaultPercent, "Go GC target percentage (GOGC; the environment's GOGC wins); -1 off, with runtime.memory_limit_mb. Higher trades memory for fewer collections: see docs/BENCHMARKS.md, Why the defaults"},
	{"runtime.memory_limit_mb", 0, "Go soft memory limit in MiB (GOMEMLIMIT; the environment's wins); 0: none. Set it in a memory-limited container so the collector works harder before the limit"},
}

// configTable renders the defaults table as README's configuration table (markdown: key,
// environment variable, default, meaning). `go test . -run TestConfigTable -update`
// writes it into README.
func configTable() string {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	var b strings.Builder
	b.WriteString("| key | env | default | meaning |\n|---|---|---|---|\n")
	for _, d := range defaults {
		def := "—"
		switch v := d.value.(type) {
		case []string:
			def = "`" + strings.Join(v, ",") + "`"
		default:
			if s := fmt.Sprint(v); s != "" {
				def = "`" + s + "`"
			}
		}
		env := "ONCEFLOW_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(d.key))
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", d.key, env, cell(def), cell(d.help))
	}
	return b.String()
}

// DefaultConfig is the configuration with every key at its default (the defaults table;
// no file, no environment): a program that embeds the runtime starts from it.
func DefaultConfig() Config {
	v := viper.New()
	for _, d := range defaults {
		v.SetDefault(d.key, d.value)
	}
	cfg, err := decodeConfig(v)
	if err != nil {
		panic(fmt.Sprintf("onceflow: the defaults do not decode: %v", err)) // TestDefaultConfig
	}
	return cfg
}

// LoadConfig resolves the configuration as the router binary does without flags: the
// environment (ONCEFLOW_*) over file (empty: $ONCEFLOW_CONFIG, else configs/router.yaml if
// present) over the defaults; unknown keys and invalid values are errors (ExitCode 2).
func LoadConfig(file string) (Config, error) {
	cfg, _, err := loadConfig(file, nil, nil)
	return cfg, err
}

func decodeConfig(v *viper.Viper) (Config, error) {
	var cfg Config
	err := v.UnmarshalExact(&cfg, func(dc *mapstructure.DecoderConfig) {
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(strictDuration, mapstructure.StringToSliceHookFunc(","))
	})
	return cfg, err
}

// defaultConfigFile is the config file read when none is named, if it exists (relative to
// the working directory). The package's tests, run at the repository root, clear it.
var defaultConfigFile = "configs/router.yaml"

// loadConfig resolves the configuration. file may be empty: then configs/router.yaml is
// used if it exists. Unknown keys are errors.
func loadConfig(file string, flags *pflag.FlagSet, bind map[string]string) (Config, *viper.Viper, error) {
	v := viper.New()
	for _, d := range defaults {
		v.SetDefault(d.key, d.value)
	}
	v.SetEnvPrefix("ONCEFLOW")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_", "-", "_"))
	v.AutomaticEnv()
	if file == "" {
		file = os.Getenv("ONCEFLOW_CONFIG")
	}
	if file == "" {
		if _, err := os.Stat(defaultConfigFile); err == nil {
			file = defaultConfigFile
		}
	}
	if file != "" {
		if st, err := os.Stat(file); err == nil && st.IsDir() {
			return Config{}, nil, badInput(fmt.Errorf("config file %s is a directory: name a .yaml file", file))
		}
		switch strings.ToLower(filepath.Ext(file)) {
		case ".yaml", ".yml", ".json", ".toml":
		default:
			return Config{}, nil, badInput(fmt.Errorf("config file %s: unknown type %q (name a .yaml, .yml, .json or .toml file)", file, filepath.Ext(file)))
		}
		v.SetConfigFile(file)
		if err := v.ReadInConfig(); err != nil {
			return Config{}, nil, badInput(fmt.Errorf("config file %s: %s", file, oneLine(err)))
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
		return Config{}, nil, badInput(fmt.Errorf("config%s: %s", inFile(file), oneLine(err)))
	}
	if err := cfg.validate(); err != nil {
		return Config{}, nil, badInput(fmt.Errorf("config%s: %w", inFile(file), err))
	}
	return cfg, v, nil
}

func inFile(f string) string {
	if f == "" {
		return ""
	}
	return " " + f
}

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

func (c Config) validate() error {
	if err := c.checkBounds(); err != nil {
		return err
	}
	// No DSN is built in: an empty db.dsn is refused (exit 2, naming the key) by the commands
	// that connect (openDB); commands that do not (plugins, config) run without one.
	if c.DB.DSN != "" {
		if _, err := dbx.ParseDSN(c.DB.DSN); err != nil {
			return fmt.Errorf("db.dsn: %w", err)
		}
	}
	if err := c.DB.validate(); err != nil {
		return err
	}
	if len(c.Kafka.Brokers) == 0 {
		return errors.New("kafka.brokers is empty")
	}
	if err := c.kafkaConfig().CheckSecurity(); err != nil {
		return err
	}
	// The inbox settings are the same for every plugin but the biz type: checked once here,
	// so bad values exit 2 before anything connects or writes.
	probe := c.inboxConfig("probe", "")
	if err := probe.WithDefaults().Validate(); err != nil {
		return fmt.Errorf("inbox.*: %w", err)
	}
	if err := c.batchConfig().Validate(); err != nil {
		return fmt.Errorf("inbox.batch_*: %w", err)
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

// inboxConfig maps inbox.* onto the inbox package's settings for one plugin.
func (c Config) inboxConfig(bizType, keyLogField string) inbox.Config {
	i := c.Inbox
	return inbox.Config{BizType: bizType, KeyLogField: keyLogField, MaxAttempts: i.MaxAttempts, BackoffInitial: i.BackoffInitial,
		BackoffMax: i.BackoffMax, Retention: i.Retention, MaxPayloadBytes: i.MaxPayloadBytes, MaxMetadataBytes: i.MaxMetadataBytes,
		HandlerTimeout: i.HandlerTimeout, StepsPerTx: i.StepsPerTx, MaxInFlightCalls: i.MaxInFlightCalls, TracerProvider: c.tracing}
}

// batchConfig maps inbox.batch_* onto the inbox package's group-commit settings.
func (c Config) batchConfig() inbox.BatchConfig {
	return inbox.BatchConfig{MaxSize: c.Inbox.BatchSize, Linger: c.Inbox.BatchLinger, Workers: c.Inbox.BatchWorkers}
}

// decodePluginConfig decodes raw (a plugins.<name> section) into target, refusing unknown keys.
func decodePluginConfig(name string, raw map[string]any, target any) error {
	if raw == nil {
		return nil
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		Result: target, ErrorUnused: true, WeaklyTypedInput: true,
		DecodeHook: mapstructure.ComposeDecodeHookFunc(strictDuration),
	})
	if err != nil {
		return err
	}
	if err := dec.Decode(raw); err != nil {
		return badInput(fmt.Errorf("config plugins.%s: %s", name, oneLine(err)))
	}
	return nil
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

// validate checks the db section's secrets and TLS: one source per password, files readable.
func (c DBConfig) validate() error {
	if _, err := c.password(false); err != nil {
		return err
	}
	if _, err := c.password(true); err != nil {
		return err
	}
	if t := c.tls(); t.Enabled() {
		if _, err := t.Config(); err != nil {
			return err
		}
	}
	return nil
}

// password is db.password or the first line of db.password_file (admin: db.admin_*); empty
// leaves the DSN's own.
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

func (c DBConfig) tls() dbx.TLS {
	return dbx.TLS{CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile, ServerName: c.TLS.ServerName}
}

// kafkaConfig maps kafka.* onto the client settings of package kafkax (defaults applied).
func (c Config) kafkaConfig() kafkax.Config {
	k := c.Kafka
	kc := kafkax.Config{
		Brokers:          k.Brokers,
		SessionTimeout:   k.SessionTimeout,
		RebalanceTimeout: k.RebalanceTimeout,
		HeartbeatEvery:   k.Heartbeat,
		MaxPollWait:      k.MaxPollWait,
		ClientID:         "onceflow-router",
		TLS: kafkax.TLS{Enabled: k.TLS.Enabled, CAFile: k.TLS.CAFile, CertFile: k.TLS.CertFile, KeyFile: k.TLS.KeyFile,
			ServerName: k.TLS.ServerName, InsecureSkipVerify: k.TLS.InsecureSkipVerify},
		SASL: kafkax.SASL{Mechanism: k.SASL.Mechanism, User: k.SASL.User, Password: k.SASL.Password, PasswordFile: k.SASL.PasswordFile},
	}
	kc = kc.WithDefaults()
	return kc
}

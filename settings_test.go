package onceflow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/gcx"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/outbox"
)

// Every setting has a meaning, and every numeric or duration setting a range: a new
// setting without one fails here. The defaults are within their ranges.
func TestEverySettingIsDeclared(t *testing.T) {
	for _, s := range settings.List(Config{}) {
		if strings.TrimSpace(s.Help) == "" {
			t.Errorf("%s has no help text", s.Key)
		}
		if numeric := isNumber(s.Default); numeric != s.HasRange {
			t.Errorf("%s: numeric or duration %t, has a range %t", s.Key, numeric, s.HasRange)
		}
	}
	if err := settings.Check(DefaultConfig()); err != nil {
		t.Errorf("the defaults are out of their own ranges: %v", err)
	}
}

func isNumber(v any) bool {
	switch v.(type) {
	case int, int64, float64, time.Duration:
		return true
	}
	return false
}

// Values out of range are bad input, one line naming the key, the value and the range, before
// anything connects; a value on the edge of its range is accepted.
func TestOutOfRangeSettings(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ yaml, want string }{
		{"relay:\n  poll_interval: 1ns\n", "relay.poll_interval 1ns outside 1ms..1m0s"},
		{"relay:\n  retry_backoff: 1ns\n", "relay.retry_backoff 1ns outside 1ms..1m0s"},
		{"relay:\n  txn_timeout: 1h\n", "relay.txn_timeout 1h0m0s outside 1s..15m0s"},
		{"relay:\n  batch_size: 0\n", "relay.batch_size 0 outside 1..10000"},
		{"relay:\n  batch_size: 10001\n", "relay.batch_size 10001 outside 1..10000"},
		{"relay:\n  shards: 257\n", "relay.shards 257 outside 1..256"},
		{"kafka:\n  heartbeat: 1ms\n", "kafka.heartbeat 1ms outside 100ms..1m0s"},
		{"inbox:\n  retention: 5m\n", "inbox.retention 5m0s outside 1h0m0s.."},
		{"inbox:\n  cleanup_batch: -3\n", "inbox.cleanup_batch -3 outside 1..100000"},
		{"inbox:\n  steps_per_transaction: 33\n", "inbox.steps_per_transaction 33 outside 1..32"},
		{"http:\n  idempotency_ttl: 30m\n", "http.idempotency_ttl 30m0s outside 1h0m0s.."},
		{"db:\n  max_open_conns: 5000\n", "db.max_open_conns 5000 outside 1..1000"},
		{"otel:\n  sample_ratio: 1.5\n", "otel.sample_ratio 1.5 outside 0..1"},
		{"otel:\n  sample_ratio: .nan\n", "otel.sample_ratio NaN outside 0..1"},
		{"relay:\n  exactly_once: false\n  shards: 4\n", "relay.shards 4 needs relay.exactly_once"},
		{"otel:\n  sample_ratio: 0\n", ""},
		{"relay:\n  linger: 0s\n  retention: 0s\n", ""},
		{"relay:\n  batch_size: 10000\n  shards: 256\n", ""},
	}
	for i, tc := range cases {
		p := filepath.Join(dir, "c"+string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		err := runRouter(context.Background(), p, "plugins")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want accepted", tc.yaml, err)
		case tc.want == "":
		case err == nil || !isBadInput(err) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
			t.Errorf("%q: %v (bad input: %t), want bad input with %q on one line", tc.yaml, err, isBadInput(err), tc.want)
		}
	}
}

// The sections are the libraries' configs, but only their settings decode: a key naming a
// library field that is no setting (the inbox table, the Kafka client id, the relay's hook)
// is an unknown key, refused like any other.
func TestOnlySettingsDecode(t *testing.T) {
	dir := t.TempDir()
	for i, yaml := range []string{
		"inbox:\n  table: other\n",
		"inbox:\n  biz_type: x\n",
		"inbox:\n  bizType: x\n",
		"inbox:\n  lock_retries: 1\n",
		"inbox:\n  MaxLockRetries: 1\n",
		"inbox:\n  select_after_claim: true\n",
		"kafka:\n  client_id: other\n",
		"kafka:\n  dial_timeout: 1s\n",
		"kafka:\n  budget: 1\n",
		"kafka:\n  max_value_bytes: 1\n",
		"db:\n  max_idle_conns: 1\n",
		"relay:\n  hook: x\n",
		"relay:\n  table: other\n",
		"relay:\n  tracer_provider: x\n",
		"http:\n  retry_after: 1s\n",
		"http:\n  observe: x\n",
		"inbox:\n  replies: true\n",
	} {
		p := filepath.Join(dir, fmt.Sprintf("k%d.yaml", i))
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(p)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "invalid keys") {
			t.Errorf("%q: %v, want refused as an unknown key", yaml, err)
		}
	}
}

// `ONCEFLOW_RELAY_BATCH_SIZE=50000 router run` is refused as bad input naming the key and
// its range, and connects to nothing: the database and the broker it names are listeners
// that count the connections they are offered (and close them at once, so a late check
// fails fast).
func TestOutOfRangeRunConnectsToNothing(t *testing.T) {
	listen := func() (string, *atomic.Int64) {
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
	for _, tc := range []struct{ env, value, want string }{
		{"ONCEFLOW_RELAY_BATCH_SIZE", "50000", "relay.batch_size 50000 outside 1..10000"},
		{"ONCEFLOW_RELAY_SHARDS", "1024", "relay.shards 1024 outside 1..256"},
		{"ONCEFLOW_HTTP_IDEMPOTENCY_TTL", "1m", "http.idempotency_ttl 1m0s outside 1h0m0s..87600h0m0s"},
		{"ONCEFLOW_RELAY_LINGER", "6s", "relay: linger 6s must be below half the lease ttl (10s)"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			db, dbConns := listen()
			broker, kafkaConns := listen()
			t.Setenv("ONCEFLOW_DB_DSN", "app@tcp("+db+")/shop")
			t.Setenv("ONCEFLOW_KAFKA_BROKERS", broker)
			t.Setenv("ONCEFLOW_ADMIN_LISTEN", "")
			t.Setenv(tc.env, tc.value)
			err := runRouter(context.Background(), "", "run")
			if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s=%s router run: %v (bad input: %t), want bad input with %q on one line", tc.env, tc.value, err, isBadInput(err), tc.want)
			}
			if d, k := dbConns.Load(), kafkaConns.Load(); d != 0 || k != 0 {
				t.Errorf("%s=%s router run: %d connections to the database and %d to the broker before refusing it", tc.env, tc.value, d, k)
			}
		})
	}
}

// companions are the settings a range edge needs beside it where settings relate (a
// heartbeat shorter than the session, a backoff range, a linger below half the lease, the
// collector off with a memory limit).
var companions = map[string]func(c *Config, edge any){
	"kafka.session_timeout": func(c *Config, edge any) {
		c.Kafka.HeartbeatEvery = min(c.Kafka.HeartbeatEvery, edge.(time.Duration)/2)
	},
	"kafka.heartbeat": func(c *Config, edge any) {
		c.Kafka.SessionTimeout = max(c.Kafka.SessionTimeout, 2*edge.(time.Duration))
	},
	"inbox.backoff_initial": func(c *Config, edge any) { c.Inbox.BackoffMax = max(c.Inbox.BackoffMax, edge.(time.Duration)) },
	"inbox.backoff_max":     func(c *Config, edge any) { c.Inbox.BackoffInitial = min(c.Inbox.BackoffInitial, edge.(time.Duration)) },
	"inbox.delayed_backoff": func(c *Config, edge any) {
		c.Inbox.DelayedBackoffMax = max(c.Inbox.DelayedBackoffMax, edge.(time.Duration))
	},
	"inbox.delayed_backoff_max": func(c *Config, edge any) {
		c.Inbox.DelayedBackoff = min(c.Inbox.DelayedBackoff, edge.(time.Duration))
	},
	"relay.linger":    func(c *Config, edge any) { c.Relay.LeaseTTL = max(c.Relay.LeaseTTL, 3*edge.(time.Duration)) },
	"relay.lease_ttl": func(c *Config, edge any) { c.Relay.Linger = min(c.Relay.Linger, edge.(time.Duration)/3) },
	"runtime.gogc":    func(c *Config, edge any) { c.Runtime.MemoryLimitMB = 1024 },
}

// libraries builds every library object `run` builds from cfg that can be built without
// connecting, and returns the first refusal: the libraries' own word on the settings.
func libraries(t *testing.T, cfg Config) error {
	t.Helper()
	a := &Setup{Config: cfg, logger: watermill.NopLogger{}}
	dc, err := a.DBConfig(false)
	if err != nil {
		return err
	}
	if err := dc.WithDefaults().Validate(); err != nil { // what dbx.Open checks before it dials
		return err
	}
	kc := a.Kafka()
	if err := kc.Validate(); err != nil {
		return err
	}
	sub, err := kc.NewParallelSubscriber("g", cfg.parallelConfig(nil), nil)
	if err != nil {
		return err
	}
	_ = sub.Close()
	h := settingsHandler{}
	// A pool of a closed port: the libraries are built on it, never run (their dialect read
	// from it fails, and falls back to MariaDB's).
	probe, err := sql.Open("mysql", "probe@tcp(127.0.0.1:1)/probe?timeout=1s")
	if err != nil {
		return err
	}
	defer probe.Close()
	ib, err := engine.New(probe, h, cfg.inboxConfig("probe", "", false), nil, nil)
	if err != nil {
		return err
	}
	b, err := ib.NewBatcher(cfg.Inbox.Batch)
	if err != nil {
		return err
	}
	b.Close()
	if _, err := engine.NewCommand(probe, h, cfg.inboxConfig("probe-cmd", "", true), nil, nil); err != nil {
		return err
	}
	if _, err := inboxops.NewCleaner(probe, cfg.cleanerConfig(), nil); err != nil {
		return err
	}
	rc, err := a.relayConfig()
	if err != nil {
		return err
	}
	if _, err := outbox.NewExactlyOnceRelay(probe, kc, rc, nil); err != nil {
		return err
	}
	if _, err := httpcmd.New(nil, cfg.HTTP.Config, nil); err != nil {
		return err
	}
	return gcx.Validate(cfg.Runtime.GOGC, cfg.Runtime.MemoryLimitMB)
}

type settingsHandler struct{ inbox.Handler }

// Every setting's range is what the libraries accept: at each end of its range (with its
// companions) the router's check before connecting and every library built from the
// configuration accept the value; one step outside, the router refuses it naming the key and
// the range, and so does the library the setting belongs to. A range wider than its library's
// would be found only after connecting; a narrower one refuses what the library takes.
func TestRangesAreTheLibraries(t *testing.T) {
	for _, s := range settings.List(Config{}) {
		if !s.HasRange {
			continue
		}
		lo, hi := outside(s.Min, -1), outside(s.Max, 1)
		if s.IsZero(lo) { // a configured 0: in range
			lo = outside(lo, -1)
		}
		for _, tc := range []struct {
			value any
			ok    bool
		}{{s.Min, true}, {s.Max, true}, {lo, false}, {hi, false}} {
			cfg := DefaultConfig()
			cfg.DB.DSN = "app@tcp(127.0.0.1:3306)/shop"
			s.Set(&cfg, tc.value)
			if f := companions[s.Key]; f != nil && tc.ok {
				f(&cfg, tc.value)
			}
			name := fmt.Sprintf("%s=%v", s.Key, tc.value)
			routerErr, libErr := cfg.validate(), libraries(t, cfg)
			if tc.ok {
				if routerErr != nil {
					t.Errorf("%s, in range: the router refuses it: %v", name, routerErr)
				}
				if libErr != nil {
					t.Errorf("%s, in range: the router accepts it, a library refuses it: %v", name, libErr)
				}
				continue
			}
			var oe *settings.OutsideError
			if !errors.As(routerErr, &oe) || oe.Key != s.Key || strings.Contains(routerErr.Error(), "\n") {
				t.Errorf("%s, out of range: router: %v, want one line naming %s and its range", name, routerErr, s.Key)
			}
			if libErr == nil && !runtimeOwn[s.Key] && !unsetOrOff(s, tc.value) {
				t.Errorf("%s, out of range: no library refuses it: the router's range is not the library's", name)
			}
		}
	}
}

// unsetOrOff reports a value a library reads as unset (its zero: the default) or, for a
// setting with an "off" value (zero tag: NoLinger, KeepPublished), as off (any negative).
func unsetOrOff(s settings.Setting, v any) bool {
	zero := reflect.Zero(s.Type()).Interface()
	return v == zero || (s.Zero != nil && reflect.ValueOf(v).Int() < 0)
}

// runtimeOwn are the ranged settings no library takes: the runtime alone checks them.
var runtimeOwn = map[string]bool{"otel.sample_ratio": true, "runtime.memory_limit_mb": true}

// outside is the value one step beyond edge (dir -1: below, 1: above) of edge's type.
func outside(edge any, dir int) any {
	switch v := edge.(type) {
	case int:
		return v + dir
	case int64:
		return v + int64(dir)
	case time.Duration:
		return v + time.Duration(dir)
	case float64:
		return math.Nextafter(v, float64(dir)*math.Inf(1))
	}
	panic(fmt.Sprintf("no step for %T", edge))
}

// A configured 0 that means "off" reaches the library as its "off" value, not as its
// default: relay.linger 0 publishes at once, relay.retention 0 keeps published rows,
// inbox.batch_linger 0 lingers not at all; from a file and through New alike.
func TestConfiguredZeros(t *testing.T) {
	p := filepath.Join(t.TempDir(), "zeros.yaml")
	if err := os.WriteFile(p, []byte("db:\n  dsn: app@tcp(127.0.0.1:3306)/shop\nrelay:\n  linger: 0s\n  retention: 0s\ninbox:\n  batch_linger: 0s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	check := func(how string, cfg Config) {
		t.Helper()
		rc, err := (&Setup{Config: cfg, logger: watermill.NopLogger{}}).relayConfig()
		if err != nil {
			t.Fatal(err)
		}
		rc = rc.WithDefaults()
		if bl := cfg.Inbox.Batch.WithDefaults().Linger; rc.Linger != outbox.NoLinger || rc.Retention != outbox.KeepPublished || bl >= 0 {
			t.Errorf("%s: relay linger %s, retention %s, batch linger %s: want none, kept, none", how, rc.Linger, rc.Retention, bl)
		}
	}
	check("file", cfg)

	code := DefaultConfig()
	code.DB.DSN = "app@tcp(127.0.0.1:3306)/shop"
	code.Relay.Linger, code.Relay.Retention, code.Inbox.Batch.Linger = 0, 0, 0
	rt, err := New(code, []inbox.Plugin{{Name: "p", Topics: []string{"t"}, ConsumerGroup: "g", BizType: "p",
		Build: func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return nil, nil }}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	check("New", rt.s.Config)

	def := DefaultConfig()
	def.DB.DSN = "app@tcp(127.0.0.1:3306)/shop"
	rc, err := (&Setup{Config: def, logger: watermill.NopLogger{}}).relayConfig()
	if err != nil || rc.Linger != 5*time.Millisecond || rc.Retention != 7*24*time.Hour || def.Inbox.Batch.Linger != 2*time.Millisecond {
		t.Fatalf("the defaults: relay linger %s retention %s, batch linger %s (%v)", rc.Linger, rc.Retention, def.Inbox.Batch.Linger, err)
	}
}

package onceflow

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Every numeric and duration setting of the settings list has a range, and every range
// names a setting that exists: a new setting without one fails here.
func TestEveryNumberHasABound(t *testing.T) {
	cfg := DefaultConfig()
	for _, d := range defaults {
		v, ok := settingValue(cfg, d.key)
		if !ok {
			t.Errorf("%s: not found in Config by its mapstructure tags", d.key)
			continue
		}
		isNumber := v.Type() == reflectDuration || v.Kind() == reflectInt || v.Kind() == reflectFloat
		if _, has := bounds[d.key]; isNumber != has {
			t.Errorf("%s: numeric or duration %t, has a bound %t", d.key, isNumber, has)
		}
	}
	for key := range bounds {
		if _, ok := settingValue(cfg, key); !ok {
			t.Errorf("bound for %s, which is not a setting", key)
		}
	}
	if err := cfg.checkBounds(); err != nil {
		t.Errorf("the defaults are out of their own bounds: %v", err)
	}
}

// Values out of range exit 2 with one line naming the key, the value and the range, before
// anything connects; a value on the edge of its range is accepted.
func TestOutOfRangeSettings(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ yaml, want string }{
		{"relay:\n  poll_interval: 1ns\n", "relay.poll_interval 1ns outside 1ms..1m0s"},
		{"relay:\n  retry_backoff: 1ns\n", "relay.retry_backoff 1ns outside 1ms..1m0s"},
		{"relay:\n  txn_timeout: 1h\n", "relay.txn_timeout 1h0m0s outside 1s..15m0s"},
		{"relay:\n  batch_size: 0\n", "relay.batch_size 0 outside 1..100000"},
		{"kafka:\n  heartbeat: 1ms\n", "kafka.heartbeat 1ms outside 100ms..1m0s"},
		{"inbox:\n  retention: 5m\n", "inbox.retention 5m0s outside 1h0m0s.."},
		{"inbox:\n  cleanup_batch: -3\n", "inbox.cleanup_batch -3 outside 1..100000"},
		{"db:\n  max_open_conns: 5000\n", "db.max_open_conns 5000 outside 1..1000"},
		{"otel:\n  sample_ratio: 1.5\n", "otel.sample_ratio 1.5 outside 0..1"},
		{"otel:\n  sample_ratio: .nan\n", "otel.sample_ratio NaN outside 0..1"},
		{"otel:\n  sample_ratio: 0\n", ""},
		{"relay:\n  linger: 0s\n  retention: 0s\n", ""},
	}
	for i, tc := range cases {
		p := filepath.Join(dir, "c"+string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := Run(context.Background(), []string{"--config", p, "plugins"})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want accepted", tc.yaml, err)
		case tc.want == "":
		case err == nil || ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
			t.Errorf("%q: %v (exit %d), want exit 2 with %q on one line", tc.yaml, err, ExitCode(err), tc.want)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("%q took %s: the check must come before anything connects", tc.yaml, el)
		}
	}
}

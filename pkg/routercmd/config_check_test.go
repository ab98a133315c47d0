package routercmd

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runOut runs the command line on args and returns what it printed.
func runOut(t *testing.T, args ...string) (string, error) {
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
	runErr := Run(context.Background(), args)
	w.Close()
	os.Stdout = old
	return <-done, runErr
}

// TestConfigCheck checks that `router config check` checks the file, the environment and
// the flags, and connects to nothing. A valid configuration gets one line and exit code 0.
// Any other gets every plugin's refusals and exit code 2. The database and the broker that
// the configuration names count the connections they are offered.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	valid := write("valid.yaml", "relay:\n  shards: 4\nplugins:\n  coupon-granter:\n    step_delay: 800ms\n    topics: [paid]\n  coupon-notifier:\n    channel: sms\n")
	rate := write("rate.yaml", "plugins:\n  coupon-granter:\n    step_failure_rate: 1.5\n")
	both := write("both.yaml", "relay:\n  shards: 400\nplugins:\n  coupon-granter:\n    step_dely: 5ms\n  coupon-notifier:\n    chanel: sms\n")
	section := write("section.yaml", "plugins:\n  coupon-grantr:\n    step_delay: 5ms\n")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want []string
	}{
		{"valid", []string{"config", "check", "--config", valid}, nil, 0,
			[]string{"config " + valid + " is valid (plugins: coupon-granter, coupon-notifier)\n"}},
		{"valid from the environment", []string{"config", "check"}, map[string]string{"ONCEFLOW_CONFIG": valid, "ONCEFLOW_PLUGINS_COUPON_GRANTER_STEP_FAILURE_RATE": "0.5"}, 0,
			[]string{"config " + valid + " is valid"}},
		{"a plugin's value out of range", []string{"config", "check", "--config", rate}, nil, 2,
			[]string{"plugins.coupon-granter.step_failure_rate 1.5 outside 0..0.99"}},
		{"every refusal", []string{"config", "check", "--config", both}, nil, 2,
			[]string{"relay.shards 400 outside 1..256", "plugins.coupon-granter.step_dely is no setting", "plugins.coupon-notifier.chanel is no setting"}},
		{"a section of no plugin", []string{"config", "check", "--config", section}, nil, 2, []string{"plugins.coupon-grantr: no such plugin"}},
		{"a plugin's value from the environment", []string{"config", "check", "--config", valid}, map[string]string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_SHARDS": "0"}, 2,
			[]string{"(env ONCEFLOW_PLUGINS_COUPON_GRANTER_SHARDS)", "plugins.coupon-granter.shards 0 outside 1..1024"}},
		{"an unknown variable", []string{"config", "check"}, map[string]string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_SEEDS": "1"}, 2,
			[]string{"ONCEFLOW_PLUGINS_COUPON_GRANTER_SEEDS is no setting of plugin coupon-granter (did you mean ONCEFLOW_PLUGINS_COUPON_GRANTER_SEED?)"}},
		{"a flag", []string{"config", "check", "--config", valid, "--log-level", "loud"}, nil, 2, []string{"log.level"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, dbConns := countingListener(t)
			broker, kafkaConns := countingListener(t)
			t.Setenv("ONCEFLOW_DB_DSN", "app@tcp("+db+")/shop")
			t.Setenv("ONCEFLOW_KAFKA_BROKERS", broker)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			out, err := runOut(t, tc.args...)
			text := out
			if err != nil {
				text = err.Error()
			}
			if ExitCode(err) != tc.code || strings.Count(strings.TrimSuffix(text, "\n"), "\n") != 0 {
				t.Fatalf("%v: %q %v (exit %d), want exit %d with one line", tc.args, out, err, ExitCode(err), tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%v: %q does not say %q", tc.args, text, w)
				}
			}
			if d, k := dbConns.Load(), kafkaConns.Load(); d != 0 || k != 0 {
				t.Errorf("%v: %d connections to the database and %d to the broker", tc.args, d, k)
			}
		})
	}
}

// TestConfigFilesPassCheck checks that every config file in configs/ passes
// `router config check`.
func TestConfigFilesPassCheck(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("configs/*.yaml: %v %v", files, err)
	}
	for _, f := range files {
		out, err := runOut(t, "config", "check", "--config", f)
		if err != nil || !strings.Contains(out, "config "+f+" is valid") {
			t.Errorf("router config check --config %s: %q %v", f, out, err)
		}
	}
}

package routercmd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestBadInput checks that bad input gets a one-line error that names the thing and how to
// fix it. Input errors exit with code 2, unreachable services with code 1, and nothing is
// written.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unknownKey := write("unknown.yaml", "db:\n  dsn: onceflow:onceflow@tcp(127.0.0.1:3306)/onceflow\n  max_open_connz: 3\n")
	badDuration := write("duration.yaml", "kafka:\n  session_timeout: ten seconds\n")
	badPlugin := write("plugin.yaml", "plugins:\n  coupon-granter:\n    step_dely: 5ms\n")
	unknownPlugin := write("noplugin.yaml", "plugins:\n  coupon-grantr:\n    step_delay: 5ms\n")
	admin := write("admin.yaml", "admin:\n  listen: ''\n")
	gcOff := write("gcoff.yaml", "runtime:\n  gogc: -1\n")
	bigPayload := write("payload.yaml", "inbox:\n  max_payload_bytes: 16777216\n")
	bigMeta := write("meta.yaml", "inbox:\n  max_metadata_bytes: 70000\n")
	tinyTimeout := write("timeout.yaml", "inbox:\n  handler_timeout: 1ns\n")
	manyAttempts := write("attempts.yaml", "inbox:\n  max_attempts: 1000000000\n")

	cases := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"unknown command", []string{"frobnicate"}, 2, []string{"unknown command"}},
		{"unknown subcommand", []string{"inbox", "frobnicate"}, 2, []string{"unknown command"}},
		{"an argument too many", []string{"--config", admin, "plugins", "extra"}, 2, []string{"unknown command"}},
		{"an argument missing", []string{"--config", admin, "outbox", "show"}, 2, []string{"accepts 1 arg"}},
		{"unknown flag", []string{"produce", "--orderz", "3"}, 2, []string{"unknown flag", "--orderz"}},
		{"invalid flag duration", []string{"verify", "--wait", "soon"}, 2, []string{"invalid argument", "soon"}},
		{"unknown config key", []string{"--config", unknownKey, "plugins"}, 2, []string{"max_open_connz"}},
		{"invalid config duration", []string{"--config", badDuration, "plugins"}, 2, []string{"invalid duration", "ten seconds"}},
		{"missing config file", []string{"--config", filepath.Join(dir, "nope.yaml"), "plugins"}, 2, []string{"nope.yaml"}},
		{"bad dsn", []string{"--dsn", "not a dsn", "verify"}, 2, []string{"db.dsn", "user:pass@tcp(host:port)/db"}},
		{"dsn without database", []string{"--dsn", "u:p@tcp(127.0.0.1:3306)/", "verify"}, 2, []string{"no database name"}},
		{"multiStatements refused", []string{"--dsn", "u:p@tcp(127.0.0.1:3306)/x?multiStatements=true", "verify"}, 2, []string{"multiStatements"}},
		{"bad produce args", []string{"produce", "--dup-rate", "1.5"}, 2, []string{"--dup-rate"}},
		{"result without ledger", []string{"--config", admin, "verify", "--result"}, 2, []string{"needs --ledger"}},
		{"unknown plugin key", []string{"--config", badPlugin, "verify"}, 2, []string{"plugins.coupon-granter", "step_dely"}},
		{"unknown plugin section", []string{"--config", unknownPlugin, "run"}, 2, []string{"plugins.coupon-grantr", "no such plugin"}},
		{"unknown plugin flag", []string{"--config", admin, "run", "--plugins", "nope"}, 2, []string{"unknown plugin", "nope"}},
		{"bad log level", []string{"--log-level", "loud", "plugins"}, 2, []string{"log.level"}},
		{"payload limit above the column", []string{"--config", bigPayload, "plugins"}, 2, []string{"inbox.max_payload_bytes 16777216 outside 1..16777215"}},
		{"metadata limit above the column", []string{"--config", bigMeta, "plugins"}, 2, []string{"inbox.max_metadata_bytes 70000 outside 256..65535"}},
		{"handler timeout of 1ns", []string{"--config", tinyTimeout, "plugins"}, 2, []string{"inbox.handler_timeout 1ns outside 1ms..24h0m0s"}},
		{"max attempts 1e9", []string{"--config", manyAttempts, "plugins"}, 2, []string{"inbox.max_attempts 1000000000 outside 1..1000"}},
		{"config file is a directory", []string{"--config", dir, "plugins"}, 2, []string{"is a directory"}},
		{"config file of no known type", []string{"--config", write("router.conf", "x"), "plugins"}, 2, []string{"unknown type", ".yaml"}},
		{"replay rate NaN", []string{"--config", admin, "replay", "--rate", "NaN", "--dry-run"}, 2, []string{"--rate NaN"}},
		{"produce rate NaN", []string{"--config", admin, "produce", "--rate", "NaN"}, 2, []string{"--rate"}},
		{"gc off without a memory limit", []string{"--config", gcOff, "plugins"}, 2, []string{"runtime.gogc -1", "runtime.memory_limit_mb"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), tc.args)
			if err == nil {
				t.Fatal("expected an error")
			}
			if got := ExitCode(err); got != tc.code {
				t.Errorf("exit code %d, want %d (%v)", got, tc.code, err)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
		})
	}
}

// TestUnreachable checks that unreachable services and missing topics exit with code 1. The
// error names the service and how to start it.
func TestUnreachable(t *testing.T) {
	testenv.Integration(t)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"database down", []string{"--dsn", "onceflow:onceflow@tcp(127.0.0.1:1)/onceflow", "verify"}, []string{"127.0.0.1:1", "unreachable", "scripts/infra.sh up"}},
		{"migrate database down", []string{"migrate", "--admin-dsn", "a:b@tcp(127.0.0.1:1)/onceflow"}, []string{"127.0.0.1:1", "unreachable"}},
		{"kafka down", []string{"--brokers", "127.0.0.1:1", "produce", "--orders", "1"}, []string{"kafka 127.0.0.1:1 unreachable", "scripts/infra.sh up"}},
		{"missing topic", []string{"produce", "--orders", "1", "--topic", "no-such-topic-onceflow"}, []string{"no-such-topic-onceflow", "does not exist"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), tc.args)
			if err == nil {
				t.Fatal("expected an error")
			}
			if got := ExitCode(err); got != 1 {
				t.Errorf("exit code %d, want 1 (%v)", got, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestPluginsListsCoupon(t *testing.T) {
	r, w, _ := os.Pipe()
	old := os.Stdout
	os.Stdout = w
	err := Run(context.Background(), []string{"plugins"})
	w.Close()
	os.Stdout = old
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, _ := r.Read(buf)
	out := string(buf[:n])
	for _, w := range []string{"coupon-granter", "order-paid", "coupon-sender", "coupon"} {
		if !strings.Contains(out, w) {
			t.Errorf("plugins output %q lacks %q", out, w)
		}
	}
}

package onceflow

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
)

// `router run` exits 1 naming the topic when one its plugins write to does not exist, before
// consuming anything; relay.check_topics=false skips the check.
func TestRunChecksWrittenTopics(t *testing.T) {
	d := testenv.DB(t, 4, migrationSets(registered())...)
	cfg := filepath.Join(t.TempDir(), "router.yaml")
	body := "admin:\n  listen: ''\nplugins:\n  coupon-granter:\n    granted_topic: onceflow-no-such-granted-topic\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Run(context.Background(), []string{"--config", cfg, "--dsn", d.DSN, "run", "--plugins", "coupon-granter"})
	if err == nil || ExitCode(err) != 1 {
		t.Fatalf("run with a missing written topic: %v (exit %d), want exit 1", err, ExitCode(err))
	}
	for _, w := range []string{"coupon-granter", "onceflow-no-such-granted-topic", "does not exist", "relay.check_topics=false"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}

	a := &app{plugins: registered()}
	granter := func() []plugin {
		t.Helper()
		p, ok, err := a.plugin("coupon-granter")
		if !ok || err != nil {
			t.Fatalf("coupon-granter: %v %v", ok, err)
		}
		return []plugin{p}
	}
	a.cfg.Plugins = map[string]map[string]any{"coupon-granter": {"granted_topic": "onceflow-no-such-granted-topic"}}
	k := testenv.Kafka(t)
	if err := a.checkWrittenTopics(k, granter()); err != nil {
		t.Fatalf("relay.check_topics=false: %v, want no check", err)
	}
	a.cfg.Relay.CheckTopics = true
	a.cfg.Plugins = nil // the defaults: coupon-granted and coupon-grant-failed, which scripts/infra.sh creates
	if err := a.checkWrittenTopics(k, granter()); err != nil {
		t.Fatalf("default topics: %v", err)
	}
	a.cfg.Plugins = map[string]map[string]any{"coupon-granter": {"failed_topic": ""}}
	if _, _, err := a.plugin("coupon-granter"); err == nil || ExitCode(err) != 2 || !strings.Contains(err.Error(), "failed_topic") {
		t.Fatalf("invalid plugin config: %v, want exit 2 naming failed_topic", err)
	}
}

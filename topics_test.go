package onceflow

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
)

// `router run` fails (not bad input: exit 1) naming the topic when one its plugins write to
// does not exist, before consuming anything; relay.check_topics=false skips the check.
func TestRunChecksWrittenTopics(t *testing.T) {
	d := testenv.DB(t, 4, migrationSets(registered())...)
	cfg := filepath.Join(t.TempDir(), "router.yaml")
	body := "admin:\n  listen: ''\nplugins:\n  coupon-granter:\n    granted_topic: onceflow-no-such-granted-topic\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ONCEFLOW_DB_DSN", d.DSN)
	err := runRouter(context.Background(), cfg, "run", "coupon-granter")
	if err == nil || isBadInput(err) {
		t.Fatalf("run with a missing written topic: %v (bad input: %t), want an error that is not bad input", err, isBadInput(err))
	}
	for _, w := range []string{"coupon-granter", "onceflow-no-such-granted-topic", "does not exist", "relay.check_topics=false"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}

	a := &Setup{plugins: registered()}
	granter := func() []Plugin {
		t.Helper()
		ps, err := a.Plugins("coupon-granter")
		if err != nil {
			t.Fatalf("coupon-granter: %v", err)
		}
		return ps
	}
	a.Config.Plugins = map[string]map[string]any{"coupon-granter": {"granted_topic": "onceflow-no-such-granted-topic"}}
	k := testenv.Kafka(t)
	if err := a.checkWrittenTopics(k, granter()); err != nil {
		t.Fatalf("relay.check_topics=false: %v, want no check", err)
	}
	a.Config.Relay.CheckTopics = true
	a.Config.Plugins = nil // the defaults: coupon-granted and coupon-grant-failed, which scripts/infra.sh creates
	if err := a.checkWrittenTopics(k, granter()); err != nil {
		t.Fatalf("default topics: %v", err)
	}
	a.Config.Plugins = map[string]map[string]any{"coupon-granter": {"failed_topic": ""}}
	if _, err := a.Plugins("coupon-granter"); err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "failed_topic") {
		t.Fatalf("invalid plugin config: %v, want exit 2 naming failed_topic", err)
	}
}

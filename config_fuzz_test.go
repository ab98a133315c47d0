package onceflow

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/onceflow/onceflow/inbox"
)

// FuzzConfigFile: any config file content either loads into a valid configuration or is
// refused with a one-line error marked as bad input (ErrBadInput); it never panics.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"db:\n  dsn: u:p@tcp(127.0.0.1:3306)/d\n",
		"kafka:\n  session_timeout: 10s\n",
		"kafka:\n  session_timeout: ten\n",
		"inbox:\n  max_attempts: -1\n",
		"plugins:\n  coupon-granter:\n    step_delay: 5ms\n",
		"plugins:\n  coupon-granter:\n    step_failure_rate: 1.5\n    stepp: 1\n  coupon-notifier:\n    channel: [a]\n",
		"plugins:\n  coupon-granter: [1]\n",
		"plugins:\n  coupon-granter:\n    seed: -1\n    shards: {a: 1}\n",
		"log: [1, 2]\n",
		"db: {dsn: 3}\n",
		"inbox:\n  table: other\n",
		"relay:\n  linger: -5ms\n",
		"\x00\xff",
		"0",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := loadConfig(p, pflag.NewFlagSet("x", pflag.ContinueOnError), nil, inbox.RegisteredPlugins())
		if err == nil {
			return
		}
		if !isBadInput(err) {
			t.Fatalf("config error not marked as bad input: %v", err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error: %q", err)
		}
	})
}

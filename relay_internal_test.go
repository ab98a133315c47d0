package onceflow

import (
	"testing"

	"github.com/onceflow/onceflow/internal/faults"
)

// The stock router's relay has no crash hook, whatever the environment says: only a chaos
// build (tools/chaosrouter) reads CHAOS_RELAY_CRASH_POINT.
func TestStockRelayIgnoresCrashPoint(t *testing.T) {
	t.Setenv(faults.RelayCrashEnv, "after-mark")
	a := &Setup{Config: DefaultConfig()}
	a.Config.DB.DSN = "u:p@tcp(127.0.0.1:3306)/onceflow"
	rc, err := a.relayConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Hook != nil {
		t.Fatal("the stock relay has a crash hook")
	}
}

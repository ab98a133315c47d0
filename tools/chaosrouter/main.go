// Command chaosrouter is the router the chaos harness (tools/chaos, scripts/chaos.sh) runs:
// the stock binary's bundled plugins plus the harness's misbehaving plugin
// (chaosplugin.go). Built with -tags onceflow_broken_<kind> it is broken on purpose
// (chaosbreak_*.go), for a run whose checker must catch the break. CHAOS_RELAY_CRASH_POINT
// makes its relay exit at a chosen point (internal/faults).
package main

import (
	"fmt"
	"os"

	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/pkg/routercmd"

	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

func main() {
	// The harness crashes relays at chosen points (tools/chaos, faults.go).
	if err := faults.SetRelayCrash(os.Getenv(faults.RelayCrashEnv)); err != nil {
		fmt.Fprintf(os.Stderr, "router: %v\n", err)
		os.Exit(2)
	}
	routercmd.Main()
}

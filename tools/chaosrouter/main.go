// Command chaosrouter is the router the chaos harness (tools/chaos, scripts/chaos.sh) runs:
// the stock binary's bundled plugins plus the harness's misbehaving plugin
// (chaosplugin.go). Built with -tags onceflow_broken_<kind> it is broken on purpose
// (chaosbreak_*.go), for a run whose checker must catch the break.
package main

import (
	"github.com/onceflow/onceflow"

	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

func main() { onceflow.Main() }

// Command loyalty is a team's own router: onceflow's whole command line (migrate, run,
// relay, replay, inbox, outbox, verify, plugins) with the team's plugin instead of the
// bundled ones.
package main

import (
	"github.com/onceflow/onceflow/pkg/routercmd"

	_ "example.com/loyalty/points" // the plugin registers itself from init()
)

func main() { routercmd.Main() }

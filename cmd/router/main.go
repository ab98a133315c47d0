// Command router is the stock onceflow binary: the command line (pkg/routercmd) over the
// runtime, with the bundled plugins. A team builds its own binary the same way, from its
// own module.
package main

import (
	"github.com/onceflow/onceflow/pkg/routercmd"

	// Plugins register themselves from init(); the binary is where they are chosen.
	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

func main() { routercmd.Main() }

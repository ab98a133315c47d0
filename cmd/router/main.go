// Command router is the stock onceflow binary: the runtime (package onceflow) with the
// bundled plugins. A team builds its own binary the same way, from its own module.
package main

import (
	"github.com/onceflow/onceflow"

	// Plugins register themselves from init(); the binary is where they are chosen.
	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

func main() { onceflow.Main() }

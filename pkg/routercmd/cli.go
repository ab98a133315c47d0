// Package routercmd is the onceflow router's command line. Its commands are run, relay,
// migrate, topics, produce, replay, inbox, outbox, verify, plugins, config check and
// version. Each is a cobra command over the runtime, which is package onceflow and its
// Setup. The stock binary, cmd/router, is Main plus blank imports of the bundled plugins. A
// team's own binary is the same few lines in its own module, with imports of its own
// plugins. Such a binary looks like this.
//
//	package main
//
//	import (
//		"github.com/onceflow/onceflow/pkg/routercmd"
//
//		_ "example.com/loyalty/points" // registers its plugin from init()
//	)
//
//	func main() { routercmd.Main() }
//
// It is the one package of pkg/ above the runtime. Only main packages import it.
package routercmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/onceflow/onceflow"
)

// Main runs the router command line on os.Args with the plugins registered with
// inbox.MustRegister. It stops on SIGINT or SIGTERM. It exits with status 0 on success. It
// exits with status 2 for bad input, such as a flag, the configuration or a DSN, and then
// nothing was changed. It exits with status 1 for any other failure.
func Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "router: %v\n", err)
		os.Exit(ExitCode(err))
	}
}

// ExitCode is the process exit code that Main uses for an error that Run returned. It is 0
// for nil and 1 for most errors. It is 2 for bad input, an error that matches
// onceflow.ErrBadInput.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, onceflow.ErrBadInput) {
		return 2
	}
	return 1
}

// badInput marks err as bad input with onceflow.BadInput. Main then exits with status 2.
func badInput(err error) error { return onceflow.BadInput(err) }

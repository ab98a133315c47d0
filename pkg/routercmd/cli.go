// Package routercmd is the onceflow router's command line: run, relay, migrate, topics,
// produce, replay, inbox, outbox, verify, plugins, config check and version, each a cobra
// command over the runtime (package onceflow, its Setup). The stock binary, cmd/router, is
// Main plus blank imports of the bundled plugins; a team's own binary is the same few lines
// in its own module, importing its own plugins:
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
// It is the one package of pkg/ above the runtime: only main packages import it.
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
// inbox.MustRegister, stops on SIGINT or SIGTERM, and exits: 0 on success, 2 for bad input
// (flags, configuration, DSN; nothing was changed), 1 for any other failure.
func Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "router: %v\n", err)
		os.Exit(ExitCode(err))
	}
}

// ExitCode is the process exit code Main uses for an error Run returned: 2 for bad input
// (onceflow.ErrBadInput), 1 otherwise (0 for nil).
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, onceflow.ErrBadInput) {
		return 2
	}
	return 1
}

// badInput marks err as bad input (onceflow.BadInput): exit code 2.
func badInput(err error) error { return onceflow.BadInput(err) }

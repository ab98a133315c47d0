// Package onceflow is the onceflow runtime as a library: configuration, the pipeline's
// wiring and lifecycle, the admin server and the router's command line. The stock binary,
// cmd/router, is its Main plus blank imports of the bundled plugins; a team's own binary is
// the same few lines in its own module, importing its own plugins:
//
//	package main
//
//	import (
//		"github.com/onceflow/onceflow"
//
//		_ "example.com/loyalty/points" // registers its plugin from init()
//	)
//
//	func main() { onceflow.Main() }
package onceflow

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
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

// ExitCode is the process exit code Main uses for an error Run returned: 2 for bad input,
// 1 otherwise (0 for nil).
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, ErrBadInput) {
		return 2
	}
	return 1
}

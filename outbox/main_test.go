package outbox_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

func TestMain(m *testing.M) {
	if os.Getenv(relayChildEnv) == "1" {
		os.Exit(relayMain())
	}
	code := m.Run()
	removePlainTestBinary()
	os.Exit(code)
}

// relayMain is `router relay` as the router's main runs it (routercmd.Main): settings from
// the ONCEFLOW_* environment, SIGINT and SIGTERM stop it, and an error is its exit code.
func relayMain() int {
	if err := faults.SetRelayCrash(os.Getenv(faults.RelayCrashEnv)); err != nil { // as the chaos build does
		fmt.Fprintf(os.Stderr, "router: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := routercmd.Run(ctx, []string{"relay"}); err != nil {
		fmt.Fprintf(os.Stderr, "router: %v\n", err)
		return routercmd.ExitCode(err)
	}
	return 0
}

// Command router runs onceflow: Kafka consumers made exactly-once in effect by an inbox,
// state machines and an outbox, all in MySQL transactions.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	// Plugins register themselves from init(); the binary is where they are chosen.
	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "router: %v\n", err)
		os.Exit(exitCode(err))
	}
}

// usageError marks bad input (flags, config, DSN): exit code 2, nothing changed.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func badInput(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

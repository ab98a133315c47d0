package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

// A plugin's code runs behind a guard. It may return an error, panic or never return. The
// delivery still ends with a recorded outcome, and no transaction outlives it.

// PanicError is a panic in plugin code, in Decode, Prepare, Handle or HandleBatch. The
// inbox recovers it and treats it as a failed attempt. After inbox.max_attempts the
// message is quarantined with ReasonPanic, and this error, stack included, as its last
// error.
type PanicError struct {
	Value any    // what the code panicked with
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("panic: %v\n\n%s", e.Value, e.Stack)
}

// ErrHandlerTimeout is wrapped by the error of an attempt whose plugin code did not return
// within inbox.handler_timeout. Its context is cancelled, so its transaction is rolled
// back and its locks released. The inbox stops waiting for it. After inbox.max_attempts the
// message is quarantined with ReasonTimeout.
var ErrHandlerTimeout = errors.New("plugin code did not return within inbox.handler_timeout")

// recovered turns a recovered panic value into a *PanicError, or nil for no panic.
func recovered(v any) error {
	if v == nil {
		return nil
	}
	return &PanicError{Value: v, Stack: debug.Stack()}
}

// guard runs fn on its own goroutine and returns its error, or a *PanicError if it
// panicked. When ctx ends first, guard returns an error wrapping ErrHandlerTimeout if ctx's
// deadline passed, else ctx's error. fn is then abandoned and may still be running. So the
// caller must not touch what fn uses again, such as its Delivery or its transaction.
func guard(ctx context.Context, what string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if err := recovered(recover()); err != nil {
				done <- err
			}
		}()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return timeoutError(ctx, what)
	}
}

// timeoutError is the error of plugin code stopped by ctx.
func timeoutError(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, ErrHandlerTimeout)
	}
	return fmt.Errorf("%s: %w", what, ctx.Err())
}

// failureReason is the quarantine reason of an attempt that failed with err. It is a
// panic, a timeout, or ReasonData for values the database refuses, which are quarantined at
// once. A handler that marked the error permanent itself keeps its reason instead of
// ReasonData. Any other failure is one that a retry may not meet again.
func failureReason(err error) Reason {
	var pe *PanicError
	switch {
	case errors.As(err, &pe):
		return ReasonPanic
	case errors.Is(err, ErrHandlerTimeout):
		return ReasonTimeout
	case isDataError(err) && !isPermanent(err):
		return ReasonData
	}
	return ReasonRetriesExhausted
}

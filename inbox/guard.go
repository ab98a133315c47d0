package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

// A plugin's code runs behind a guard: whatever it does — return an error, panic, or never
// return — the delivery ends with a recorded outcome and no transaction outlives it.

// PanicError is a panic in plugin code (Decode, Prepare, Handle, HandleBatch), recovered by
// the inbox and treated as a failed attempt; after inbox.max_attempts the message is
// quarantined with ReasonPanic and this error, stack included, as its last error.
type PanicError struct {
	Value any    // what the code panicked with
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("panic: %v\n\n%s", e.Value, e.Stack)
}

// ErrHandlerTimeout is wrapped by the error of an attempt whose plugin code did not return
// within inbox.handler_timeout. Its context is cancelled (so its transaction is rolled back
// and its locks released) and the inbox stops waiting for it; after inbox.max_attempts the
// message is quarantined with ReasonTimeout.
var ErrHandlerTimeout = errors.New("plugin code did not return within inbox.handler_timeout")

// recovered turns a recovered panic value into a *PanicError (nil for no panic).
func recovered(v any) error {
	if v == nil {
		return nil
	}
	return &PanicError{Value: v, Stack: debug.Stack()}
}

// guard runs fn on its own goroutine and returns its error, a *PanicError if it panicked,
// or, when ctx ends first, an error wrapping ErrHandlerTimeout (if ctx's deadline passed)
// or ctx's error. In the last case fn is abandoned: it may still be running, so the caller
// must not touch what fn uses (its Delivery, its transaction) again.
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

// failureReason is the quarantine reason of an attempt that failed with err: a panic, a
// timeout, values the database refuses (ReasonData, quarantined at once; unless the handler
// marked the error permanent itself, which keeps its reason), else a failure that a retry
// may not meet again.
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

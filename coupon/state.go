package coupon

import (
	"errors"
	"fmt"
	"slices"
)

// State of a grant.
type State string

const (
	StateInit           State = "INIT"
	StateLocked         State = "LOCKED"
	StateBudgetDeducted State = "BUDGET_DEDUCTED"
	StateGranted        State = "GRANTED"
	StateFailed         State = "FAILED"
)

// States lists every state in happy-path order, FAILED last.
var States = []State{StateInit, StateLocked, StateBudgetDeducted, StateGranted, StateFailed}

var (
	// ErrIllegalTransition means the transition is not in the state machine.
	ErrIllegalTransition = errors.New("coupon: illegal state transition")
	// ErrTerminal means the grant is GRANTED or FAILED and accepts nothing.
	ErrTerminal = errors.New("coupon: grant is in a terminal state")
	// ErrUnknownState means a state string is not one of States.
	ErrUnknownState = errors.New("coupon: unknown state")
	// ErrStaleState means the optimistic-lock update found another state. A concurrent or
	// repeated attempt advanced the grant first. The step is rolled back and read again.
	ErrStaleState = errors.New("coupon: grant state changed concurrently")
	// ErrStockExhausted and ErrBudgetExhausted are permanent business failures.
	ErrStockExhausted  = errors.New("coupon: stock exhausted")
	ErrBudgetExhausted = errors.New("coupon: budget exhausted")
)

// ParseState parses a stored state.
func ParseState(s string) (State, error) {
	for _, st := range States {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: %q", ErrUnknownState, s)
}

// index is s's place in States, or -1 for a state not in it.
func (s State) index() int { return slices.Index(States, s) }

// Terminal reports whether s accepts no further transition.
func (s State) Terminal() bool { return s == StateGranted || s == StateFailed }

// Next is the happy-path successor of a non-terminal state, "" for terminal ones.
func (s State) Next() State {
	switch s {
	case StateInit:
		return StateLocked
	case StateLocked:
		return StateBudgetDeducted
	case StateBudgetDeducted:
		return StateGranted
	}
	return ""
}

// CanTransitTo reports whether the transition from s to to is legal. A legal transition is
// one step forward on the happy path, or from any non-terminal state to FAILED.
func (s State) CanTransitTo(to State) bool {
	if s.Terminal() {
		return false
	}
	if to == StateFailed {
		return s == StateInit || s == StateLocked || s == StateBudgetDeducted
	}
	return to != "" && s.Next() == to
}

// Transit returns nil for a legal transition and a sentinel-wrapping error otherwise.
func Transit(from, to State) error {
	if _, err := ParseState(string(from)); err != nil {
		return err
	}
	if _, err := ParseState(string(to)); err != nil {
		return err
	}
	if from.Terminal() {
		return fmt.Errorf("%w: %s → %s", ErrTerminal, from, to)
	}
	if !from.CanTransitTo(to) {
		return fmt.Errorf("%w: %s → %s", ErrIllegalTransition, from, to)
	}
	return nil
}

// Step names the external call that moves a grant out of a state. The name is half of the
// call's idempotency key.
func (s State) Step() string {
	switch s {
	case StateInit:
		return "lock_stock"
	case StateLocked:
		return "deduct_budget"
	case StateBudgetDeducted:
		return "write_wallet"
	}
	return ""
}

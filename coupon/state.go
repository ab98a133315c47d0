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

// allStates lists every state in happy-path order, FAILED last.
var allStates = []State{StateInit, StateLocked, StateBudgetDeducted, StateGranted, StateFailed}

var (
	// errIllegalTransition means the transition is not in the state machine.
	errIllegalTransition = errors.New("coupon: illegal state transition")
	// errTerminal means the grant is GRANTED or FAILED and accepts nothing.
	errTerminal = errors.New("coupon: grant is in a terminal state")
	// errUnknownState means a state string is not one of allStates.
	errUnknownState = errors.New("coupon: unknown state")
	// errStaleState means the optimistic-lock update found another state. A concurrent or
	// repeated attempt advanced the grant first. The step is rolled back and read again.
	errStaleState = errors.New("coupon: grant state changed concurrently")
	// errStockExhausted and errBudgetExhausted are permanent business failures.
	errStockExhausted  = errors.New("coupon: stock exhausted")
	errBudgetExhausted = errors.New("coupon: budget exhausted")
)

// parseState parses a stored state.
func parseState(s string) (State, error) {
	for _, st := range allStates {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: %q", errUnknownState, s)
}

// index is s's place in allStates, or -1 for a state not in it.
func (s State) index() int { return slices.Index(allStates, s) }

// terminal reports whether s accepts no further transition.
func (s State) terminal() bool { return s == StateGranted || s == StateFailed }

// next is the happy-path successor of a non-terminal state, "" for terminal ones.
func (s State) next() State {
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

// canTransitTo reports whether the transition from s to to is legal. A legal transition is
// one step forward on the happy path, or from any non-terminal state to FAILED.
func (s State) canTransitTo(to State) bool {
	if s.terminal() {
		return false
	}
	if to == StateFailed {
		return s == StateInit || s == StateLocked || s == StateBudgetDeducted
	}
	return to != "" && s.next() == to
}

// transit returns nil for a legal transition and a sentinel-wrapping error otherwise.
func transit(from, to State) error {
	if _, err := parseState(string(from)); err != nil {
		return err
	}
	if _, err := parseState(string(to)); err != nil {
		return err
	}
	if from.terminal() {
		return fmt.Errorf("%w: %s → %s", errTerminal, from, to)
	}
	if !from.canTransitTo(to) {
		return fmt.Errorf("%w: %s → %s", errIllegalTransition, from, to)
	}
	return nil
}

// step names the external call that moves a grant out of a state. The name is half of the
// call's idempotency key.
func (s State) step() string {
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

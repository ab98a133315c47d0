package coupon_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/onceflow/onceflow/coupon"
)

// unknownState is not one of coupon.AllStates.
const unknownState = coupon.State("REFUNDED")

// legal is the state machine written out independently of state.go. It holds the three
// happy-path steps and every non-terminal state to FAILED. Everything else is illegal.
var legal = map[[2]coupon.State]bool{
	{coupon.StateInit, coupon.StateLocked}:            true,
	{coupon.StateLocked, coupon.StateBudgetDeducted}:  true,
	{coupon.StateBudgetDeducted, coupon.StateGranted}: true,
	{coupon.StateInit, coupon.StateFailed}:            true,
	{coupon.StateLocked, coupon.StateFailed}:          true,
	{coupon.StateBudgetDeducted, coupon.StateFailed}:  true,
}

func known(s coupon.State) bool {
	for _, k := range coupon.AllStates {
		if k == s {
			return true
		}
	}
	return false
}

func terminal(s coupon.State) bool { return s == coupon.StateGranted || s == coupon.StateFailed }

var sentinels = []error{coupon.ErrUnknownState, coupon.ErrTerminal, coupon.ErrIllegalTransition}

func TestStatesList(t *testing.T) {
	want := []coupon.State{coupon.StateInit, coupon.StateLocked, coupon.StateBudgetDeducted, coupon.StateGranted, coupon.StateFailed}
	if len(coupon.AllStates) != len(want) {
		t.Fatalf("States = %v, want %v", coupon.AllStates, want)
	}
	for i := range want {
		if coupon.AllStates[i] != want[i] {
			t.Fatalf("States = %v, want %v", coupon.AllStates, want)
		}
	}
}

// TestTransitions checks CanTransitTo and Transit for every pair of states, over the five
// states and an unknown one.
func TestTransitions(t *testing.T) {
	all := append(append([]coupon.State{}, coupon.AllStates...), unknownState)
	type tc struct {
		name     string
		from, to coupon.State
		can      bool
		wantErr  error // nil, or the sentinel Transit must wrap
	}
	var cases []tc
	for _, from := range all {
		for _, to := range all {
			c := tc{name: string(from) + "->" + string(to), from: from, to: to, can: legal[[2]coupon.State{from, to}]}
			switch {
			case !known(from) || !known(to):
				c.wantErr = coupon.ErrUnknownState
			case terminal(from):
				c.wantErr = coupon.ErrTerminal
			case !c.can:
				c.wantErr = coupon.ErrIllegalTransition
			}
			cases = append(cases, c)
		}
	}
	if len(cases) != 36 {
		t.Fatalf("built %d cases, want 36", len(cases))
	}
	nLegal := 0
	for _, c := range cases {
		if c.can {
			nLegal++
		}
		t.Run(c.name, func(t *testing.T) {
			if got := c.from.CanTransitTo(c.to); got != c.can {
				t.Errorf("%s.CanTransitTo(%s) = %v, want %v", c.from, c.to, got, c.can)
			}
			err := coupon.Transit(c.from, c.to)
			if c.wantErr == nil {
				if err != nil {
					t.Fatalf("Transit(%s, %s) = %v, want nil", c.from, c.to, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Transit(%s, %s) = nil, want %v", c.from, c.to, c.wantErr)
			}
			for _, s := range sentinels {
				if got, want := errors.Is(err, s), s == c.wantErr; got != want {
					t.Errorf("Transit(%s, %s) = %v: errors.Is(err, %v) = %v, want %v", c.from, c.to, err, s, got, want)
				}
			}
			if errors.Is(err, coupon.ErrStaleState) {
				t.Errorf("Transit(%s, %s) = %v must not be ErrStaleState", c.from, c.to, err)
			}
		})
	}
	if nLegal != 6 {
		t.Errorf("%d legal transitions, want 6", nLegal)
	}
}

func TestTerminalStatesAcceptNothing(t *testing.T) {
	for _, from := range []coupon.State{coupon.StateGranted, coupon.StateFailed} {
		for _, to := range append(append([]coupon.State{}, coupon.AllStates...), unknownState, "") {
			if from.CanTransitTo(to) {
				t.Errorf("%s.CanTransitTo(%q) = true", from, to)
			}
		}
	}
}

func TestNextTerminalStep(t *testing.T) {
	cases := []struct {
		name     string
		s        coupon.State
		next     coupon.State
		terminal bool
		step     string
	}{
		{"INIT", coupon.StateInit, coupon.StateLocked, false, "lock_stock"},
		{"LOCKED", coupon.StateLocked, coupon.StateBudgetDeducted, false, "deduct_budget"},
		{"BUDGET_DEDUCTED", coupon.StateBudgetDeducted, coupon.StateGranted, false, "write_wallet"},
		{"GRANTED", coupon.StateGranted, "", true, ""},
		{"FAILED", coupon.StateFailed, "", true, ""},
		{"unknown", unknownState, "", false, ""},
		{"empty", "", "", false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.s.Next(); got != c.next {
				t.Errorf("%q.Next() = %q, want %q", c.s, got, c.next)
			}
			if got := c.s.Terminal(); got != c.terminal {
				t.Errorf("%q.Terminal() = %v, want %v", c.s, got, c.terminal)
			}
			if got := c.s.Step(); got != c.step {
				t.Errorf("%q.Step() = %q, want %q", c.s, got, c.step)
			}
			// The happy-path successor is always a legal transition.
			if c.next != "" && !c.s.CanTransitTo(c.next) {
				t.Errorf("%q.CanTransitTo(Next()=%q) = false", c.s, c.next)
			}
		})
	}
}

func TestParseState(t *testing.T) {
	for _, s := range coupon.AllStates {
		t.Run(string(s), func(t *testing.T) {
			got, err := coupon.ParseState(string(s))
			if err != nil || got != s {
				t.Fatalf("ParseState(%q) = %q, %v", s, got, err)
			}
		})
	}
	for _, bad := range []string{string(unknownState), "", "init", " INIT", "INIT ", "GRANTED\x00"} {
		t.Run("bad_"+bad, func(t *testing.T) {
			got, err := coupon.ParseState(bad)
			if !errors.Is(err, coupon.ErrUnknownState) {
				t.Fatalf("ParseState(%q) = %q, %v; want ErrUnknownState", bad, got, err)
			}
			if got != "" {
				t.Errorf("ParseState(%q) returned state %q with an error", bad, got)
			}
		})
	}
}

// TestStateMachineSteps walks the happy path: each state's outside call, and whether it
// may still fail. A transition out of it is legal only along the path or to FAILED.
func TestStateMachineSteps(t *testing.T) {
	var got []string
	for s := coupon.StateInit; s != ""; s = s.Next() {
		got = append(got, fmt.Sprint(s, " ", s.Step(), " ", s.CanTransitTo(coupon.StateFailed)))
	}
	want := []string{"INIT lock_stock true", "LOCKED deduct_budget true", "BUDGET_DEDUCTED write_wallet true", "GRANTED  false"}
	if !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q", got, want)
	}
	for _, tc := range []struct {
		from, to coupon.State
		want     error
	}{
		{coupon.StateInit, coupon.StateLocked, nil},
		{coupon.StateInit, coupon.StateGranted, coupon.ErrIllegalTransition},
		{coupon.StateGranted, coupon.StateFailed, coupon.ErrTerminal},
		{"REFUNDED", coupon.StateFailed, coupon.ErrUnknownState},
	} {
		if err := coupon.Transit(tc.from, tc.to); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s → %s: %v, want %v", tc.from, tc.to, err, tc.want)
		}
	}
}

package coupon

import (
	"testing"

	"github.com/onceflow/onceflow/inbox/engine"
)

// The audit's own SQL names the reason of a resolved row, which the engine writes.
func TestReasonResolvedIsTheEngines(t *testing.T) {
	if reasonResolved != string(engine.ReasonResolved) {
		t.Fatalf("reasonResolved %q, the engine's %q", reasonResolved, engine.ReasonResolved)
	}
}

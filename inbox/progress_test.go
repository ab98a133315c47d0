package inbox_test

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/inbox"
)

func TestProgressString(t *testing.T) {
	for p, want := range map[inbox.Progress]string{inbox.Done: "done", inbox.Continue: "continue", 0: "invalid(0)", 7: "invalid(7)"} {
		if got := p.String(); got != want || (p == 0) != strings.HasPrefix(got, "invalid(0") {
			t.Errorf("%d: %q, want %q", int(p), got, want)
		}
	}
}

package routercmd

import (
	"path/filepath"
	"testing"

	"github.com/onceflow/onceflow/internal/buildinfo"
)

// TestVersionCommand checks that `router version` prints the binary's build line and reads
// no configuration. A missing or broken configuration does not stop it.
func TestVersionCommand(t *testing.T) {
	want := buildinfo.Read().String() + "\n"
	for _, args := range [][]string{
		{"version"},
		{"--config", filepath.Join(t.TempDir(), "missing.yaml"), "version"},
		{"--log-level", "loud", "version"},
	} {
		out, err := capture(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if out != want {
			t.Fatalf("%v printed %q, want %q", args, out, want)
		}
	}
}

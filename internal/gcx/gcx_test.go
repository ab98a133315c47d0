package gcx

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	for _, c := range []struct {
		percent, limit int
		ok             bool
	}{
		{400, 0, true}, {100, 512, true}, {1, 0, true}, {-1, 1024, true},
		{0, 0, false}, {-2, 0, false}, {100001, 0, false}, {100, -1, false},
		{-1, 0, false}, // collector off and no limit: unbounded heap
	} {
		if err := Validate(c.percent, c.limit); (err == nil) != c.ok {
			t.Errorf("Validate(%d, %d) = %v, want ok=%v", c.percent, c.limit, err, c.ok)
		}
	}
}

func TestApplyRespectsEnvironment(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	got := Apply(300, 256)
	if prev := debug.SetGCPercent(100); prev != 300 {
		t.Errorf("GOGC after Apply(300) = %d", prev)
	}
	if lim := debug.SetMemoryLimit(-1); lim != 256<<20 {
		t.Errorf("memory limit after Apply(_, 256) = %d", lim)
	}
	if got != "gogc=300 memory_limit=256MiB" {
		t.Errorf("Apply reported %q", got)
	}

	debug.SetGCPercent(100)
	t.Setenv("GOGC", "150")
	t.Setenv("GOMEMLIMIT", "1GiB")
	got = Apply(300, 256)
	if prev := debug.SetGCPercent(100); prev != 100 {
		t.Errorf("Apply changed GOGC to %d although GOGC is set in the environment", prev)
	}
	if !strings.Contains(got, "(GOGC)") || !strings.Contains(got, "(GOMEMLIMIT)") {
		t.Errorf("Apply reported %q, want the environment's settings named", got)
	}
}

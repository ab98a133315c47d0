package buildinfo_test

import (
	"runtime/debug"
	"testing"

	"github.com/onceflow/onceflow/internal/buildinfo"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want buildinfo.Info
		line string
	}{
		{
			name: "release",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/onceflow/onceflow", Version: "v1.2.3"},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "1a2b3c"}, {Key: "vcs.modified", Value: "false"}}},
			want: buildinfo.Info{Module: "github.com/onceflow/onceflow", Version: "v1.2.3", Revision: "1a2b3c", GoVersion: "go1.26.8"},
			line: "github.com/onceflow/onceflow v1.2.3 (commit 1a2b3c) go1.26.8",
		},
		{
			name: "modified checkout",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/loyalty", Version: "(devel)"},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ffff"}, {Key: "vcs.modified", Value: "true"}}},
			want: buildinfo.Info{Module: "example.com/loyalty", Version: "(devel)", Revision: "ffff", Modified: true, GoVersion: "go1.26.8"},
			line: "example.com/loyalty (devel) (commit ffff, modified) go1.26.8",
		},
		{
			name: "nothing stamped",
			bi:   debug.BuildInfo{},
			want: buildinfo.Info{Module: "unknown", Version: "unknown", Revision: "unknown", GoVersion: "unknown"},
			line: "unknown unknown (commit unknown) unknown",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := buildinfo.FromBuildInfo(&tc.bi)
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if got.String() != tc.line {
				t.Fatalf("line %q, want %q", got.String(), tc.line)
			}
		})
	}
}

// A test binary has build information: its Go version is the running toolchain's.
func TestRead(t *testing.T) {
	if in := buildinfo.Read(); in.GoVersion == buildinfo.Unknown || in.Module == buildinfo.Unknown {
		t.Fatalf("Read() = %+v: no Go version or module", in)
	}
}

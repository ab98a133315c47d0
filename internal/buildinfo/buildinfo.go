// Package buildinfo reads what the Go toolchain stamped into the binary with
// runtime/debug.ReadBuildInfo. That is the main module's version, the commit it was built
// from and the Go version. `router version` prints it and /metrics exports it as
// onceflow_build_info.
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Unknown stands for a value the build did not record.
const Unknown = "unknown"

// Info is the binary's build information.
type Info struct {
	Module    string // the main module's path (a team's own router has its own)
	Version   string // the main module's version: v1.2.3 from `go install …@v1.2.3`, (devel) from a checkout
	Revision  string // the commit (vcs.revision), Unknown when not stamped (-buildvcs=false, no .git)
	Modified  bool   // the work tree had changes (vcs.modified)
	GoVersion string // the toolchain that built the binary, e.g. go1.26.8
}

// Read returns the running binary's build information. A field the build did not record
// is Unknown.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Module: Unknown, Version: Unknown, Revision: Unknown, GoVersion: Unknown}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo is Read's mapping of bi.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Module: or(bi.Main.Path), Version: or(bi.Main.Version), Revision: Unknown, GoVersion: or(bi.GoVersion)}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = or(s.Value)
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is the one line `router version` prints, such as the following.
//
//	github.com/onceflow/onceflow v1.2.3 (commit 1a2b3c4d…, modified) go1.26.8
func (in Info) String() string {
	var b strings.Builder
	b.WriteString(in.Module + " " + in.Version + " (commit " + in.Revision)
	if in.Modified {
		b.WriteString(", modified")
	}
	b.WriteString(") " + in.GoVersion)
	return b.String()
}

func or(s string) string {
	if s == "" {
		return Unknown
	}
	return s
}

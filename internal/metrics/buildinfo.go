package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/buildinfo"
)

// newBuildInfo is onceflow_build_info{version,revision,goversion} 1. It says which build a
// process runs, for a dashboard to join on.
func newBuildInfo(in buildinfo.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "onceflow", Name: "build_info",
		Help:        "The router's build: main module version, commit (vcs.revision) and Go version; always 1.",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision, "goversion": in.GoVersion},
	})
	g.Set(1)
	return g
}

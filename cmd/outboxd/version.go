package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildVersion describes the binary from the build info Go embeds: the
// module version (or "(devel)" for a build from a checkout), the VCS
// revision and time, and the Go version.
type buildVersion struct {
	Version, Revision, Time, GoVersion string
	Modified                           bool
}

// commit and version are set by `make build` (-ldflags -X) where the Go
// toolchain does not stamp VCS information (GOFLAGS=-buildvcs=false).
var commit, version string

func readBuildVersion() (v buildVersion) {
	v = buildVersion{Version: "(unknown)", Revision: "unknown"}
	defer func() {
		if commit != "" && v.Revision == "unknown" {
			v.Revision = commit
		}
		if version != "" && (v.Version == "(devel)" || v.Version == "(unknown)") {
			v.Version = version
		}
	}()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Version, v.GoVersion = bi.Main.Version, bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (v buildVersion) String() string {
	rev := v.Revision
	if v.Modified {
		rev += "+modified"
	}
	s := fmt.Sprintf("outboxd %s (commit %s", v.Version, rev)
	if v.Time != "" {
		s += ", " + v.Time
	}
	return s + ", " + v.GoVersion + ")"
}

func cmdVersion(w io.Writer) error {
	_, err := fmt.Fprintln(w, readBuildVersion())
	return err
}

// registerBuildInfo adds outboxd_build_info{version,revision,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer) {
	v := readBuildVersion()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outboxd_build_info",
		Help: "A constant 1 labelled with the version, VCS revision and Go version outboxd was built from.",
		ConstLabels: prometheus.Labels{
			"version": v.Version, "revision": v.Revision, "goversion": v.GoVersion,
		},
	})
	g.Set(1)
	reg.MustRegister(g)
}

package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/buildinfo"
)

// /metrics names the running build: onceflow_build_info with the build's labels, value 1.
func TestBuildInfoExported(t *testing.T) {
	m := New(nil)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	in := buildinfo.Read()
	want := `onceflow_build_info{goversion="` + in.GoVersion + `",revision="` + in.Revision + `",version="` + in.Version + `"} 1`
	if !strings.Contains(rec.Body.String(), want+"\n") {
		t.Fatalf("/metrics has no line %s", want)
	}
}

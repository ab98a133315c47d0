package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// /metrics says whether the HTTP commands are served: onceflow_http_commands_enabled is 0
// with http.listen empty and 1 once the listener serves them. A second call sets the same
// series.
func TestHTTPEnabledExported(t *testing.T) {
	m := New(nil)
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	if strings.Contains(scrape(), "onceflow_http_commands_enabled") {
		t.Fatal("the gauge is exported before the HTTP part starts")
	}
	m.SetHTTPEnabled(false)
	if !strings.Contains(scrape(), "\nonceflow_http_commands_enabled 0\n") {
		t.Fatalf("http.listen empty: want onceflow_http_commands_enabled 0:\n%s", scrape())
	}
	m.SetHTTPEnabled(true)
	if !strings.Contains(scrape(), "\nonceflow_http_commands_enabled 1\n") {
		t.Fatalf("commands served: want onceflow_http_commands_enabled 1:\n%s", scrape())
	}
}

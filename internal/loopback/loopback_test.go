package loopback_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/onceflow/onceflow/internal/loopback"
)

// A loopback name is localhost or a loopback IP, with or without a port; any other name,
// one that merely starts or ends like one included, is not.
func TestName(t *testing.T) {
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"localhost", true},
		{"LOCALHOST:9464", true},
		{"localhost:8080", true},
		{"127.0.0.1", true},
		{"127.0.0.1:8080", true},
		{"127.1.2.3:8080", true},
		{"[::1]:8080", true},
		{"[::1]", true},
		{"::1", true},
		{"", false},
		{":8080", false},
		{"rebind.example", false},
		{"rebind.example:8080", false},
		{"127.0.0.1.rebind.example:8080", false},
		{"localhost.rebind.example", false},
		{"localhost.", false},
		{"0.0.0.0:8080", false},
		{"[::]:8080", false},
		{"10.0.0.5:8080", false},
		{"2130706433:8080", false}, // 127.0.0.1 as a number: a name to a resolver, not an IP to Go
		{"0x7f.0.0.1", false},
	} {
		if got := loopback.Name(tc.host); got != tc.want {
			t.Errorf("Name(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
}

// Only serves requests for a loopback name and refuses the others with 421 and a fixed
// text that does not echo the Host, or with the caller's refusal.
func TestOnly(t *testing.T) {
	served := 0
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ })
	for host, want := range map[string]int{"localhost:1": http.StatusOK, "[::1]:1": http.StatusOK, "127.0.0.1:1": http.StatusOK,
		"rebind.example:1": http.StatusMisdirectedRequest, "<script>": http.StatusMisdirectedRequest} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host = host
		loopback.Only(h, nil).ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != want {
			t.Errorf("Host %q: %d, want %d", host, rec.Code, want)
		}
		if want != http.StatusOK && string(body) != loopback.Message+"\n" {
			t.Errorf("Host %q: body %q, want the fixed text", host, body)
		}
	}
	if served != 3 {
		t.Errorf("served %d requests, want the 3 for loopback names", served)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Host = "rebind.example"
	loopback.Only(h, func(w http.ResponseWriter) { w.WriteHeader(http.StatusTeapot) }).ServeHTTP(rec, req)
	if rec.Code != http.StatusTeapot || served != 3 {
		t.Errorf("own refusal: %d, served %d", rec.Code, served)
	}
}

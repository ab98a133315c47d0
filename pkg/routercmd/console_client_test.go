package routercmd

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/console"
	"github.com/onceflow/onceflow/internal/testenv"
)

// These helpers use the console as an operator's browser does. They serve the tests that
// mix the command line and the console. internal/console's own tests have the same helpers.

// testConsole serves a console on a loopback test server and returns its base URL.
func testConsole(t *testing.T, cfg console.Config) string {
	t.Helper()
	c, err := console.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(func() { srv.Close(); c.Close() })
	return srv.URL
}

// browser is an HTTP client with a cookie jar that follows no redirect.
func browser(t *testing.T) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, req *http.Request) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return do(t, c, req)
}

// post sends a form as a browser on the console's page does, with the console's own Origin.
func post(t *testing.T, c *http.Client, base, path string, form url.Values) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	return do(t, c, req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf opens path and returns the form token of its page. The jar keeps the cookie.
func csrf(t *testing.T, c *http.Client, base, path string) string {
	t.Helper()
	code, body, _ := get(t, c, base+path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("GET %s (%d): no CSRF field in the page:\n%s", path, code, body)
	}
	return m[1]
}

func count(t *testing.T, d testenv.Database, q string, args ...any) int {
	t.Helper()
	var n int
	if err := d.DB.QueryRow(testenv.Dialect().Rebind(q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func rowID(t *testing.T, d testenv.Database, biz, key string) int64 {
	t.Helper()
	var id int64
	if err := d.DB.QueryRow(testenv.Dialect().Rebind("SELECT id FROM inbox WHERE biz_type = ? AND dedup_key = ?"), biz, key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

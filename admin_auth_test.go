package onceflow

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/loopback"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestAdminListenNeedsToken checks that an admin listener beyond loopback without a token
// is refused before anything starts. The refusal is bad input, on one line naming the key.
// A token that is too short is refused too. A loopback listener needs no token.
func TestAdminListenNeedsToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		admin AdminConfig
		want  string // "" valid
	}{
		{AdminConfig{Listen: "127.0.0.1:9464"}, ""},
		{AdminConfig{Listen: "localhost:9464"}, ""},
		{AdminConfig{Listen: "[::1]:9464"}, ""},
		{AdminConfig{Listen: ""}, ""},
		{AdminConfig{Listen: "0.0.0.0:9464"}, "admin.listen \"0.0.0.0:9464\" is reachable beyond this machine"},
		{AdminConfig{Listen: ":9464"}, "set admin.token"},
		{AdminConfig{Listen: "10.1.2.3:9464"}, "set admin.token"},
		{AdminConfig{Listen: "0.0.0.0:9464", Token: "short"}, "admin.token: want at least 16"},
		{AdminConfig{Listen: "0.0.0.0:9464", Token: "with a space in it, long enough"}, "admin.token: want at least 16 printable"},
		{AdminConfig{Listen: "0.0.0.0:9464", Token: "s3cret-token-0123456789"}, ""},
		{AdminConfig{Listen: "0.0.0.0:9464", TokenFile: tokenFile}, ""},
		{AdminConfig{Listen: "0.0.0.0:9464", TokenFile: filepath.Join(dir, "missing")}, "admin.token_file"},
		{AdminConfig{Listen: "0.0.0.0:9464", Token: "s3cret-token-0123456789", TokenFile: tokenFile}, "set one, not both"},
		{AdminConfig{Listen: "9464"}, "want host:port"},
	} {
		err := tc.admin.validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.admin, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error with %q", tc.admin, err, tc.want)
		}
	}

	// `router run` loads it so, and gets bad input before anything connects.
	cfg := filepath.Join(dir, "open.yaml")
	if err := os.WriteFile(cfg, []byte("admin:\n  listen: 0.0.0.0:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := runRouter(context.Background(), cfg, "run")
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "admin.token") {
		t.Fatalf("run with an open admin listener and no token: %v (bad input: %t), want bad input naming admin.token", err, isBadInput(err))
	}
}

// TestAdminToken checks that with a token, /metrics and /readyz answer 401 to a request
// without it or with a wrong one, and serve a request with it. /healthz stays open for
// liveness probes. The server has all four timeouts.
func TestAdminToken(t *testing.T) {
	d := testenv.DB(t, 2)
	addr := freeAddr(t)
	const token = "s3cret-token-0123456789"
	a := &Setup{Config: Config{Admin: AdminConfig{Listen: addr, Token: token}}, logger: watermill.NopLogger{}}
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := a.startAdmin(ctx, d.DB, testenv.Kafka(t), metrics.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); stop() })
	get := func(path, auth string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/metrics", "/readyz"} {
		for _, auth := range []string{"", "Bearer wrong-token-0123456789", token, "Basic " + token} {
			if code := get(path, auth); code != http.StatusUnauthorized {
				t.Errorf("%s with Authorization %q: %d, want 401", path, auth, code)
			}
		}
	}
	if code := get("/metrics", "Bearer "+token); code != http.StatusOK {
		t.Errorf("/metrics with the token: %d, want 200", code)
	}
	if code := get("/readyz", "Bearer "+token); code == http.StatusUnauthorized {
		t.Errorf("/readyz with the token: 401")
	}
	if code := get("/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz: %d, want 200 without a token", code)
	}
	srv := newAdminServer(http.NewServeMux())
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Errorf("admin server timeouts %v/%v/%v/%v: want all four set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
}

// hostGet sends method path to the listener at addr with the Host header host and returns
// the status, the body and the Content-Type.
func hostGet(t *testing.T, method, addr, path, host string, body io.Reader, hdr map[string]string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Content-Type")
}

// rawRequest writes req to addr as it is and returns the answer's status line.
func rawRequest(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	return strings.TrimSpace(line)
}

// foreignHosts are the Host headers that a page of another site makes a browser on this
// machine send to a loopback listener. The page does so once it re-points its DNS name to
// 127.0.0.1.
func foreignHosts(port string) []string {
	return []string{"rebind.example:" + port, "rebind.example", "127.0.0.1.rebind.example:" + port,
		"localhost.rebind.example:" + port, "10.0.0.5:" + port, "0.0.0.0:" + port}
}

// TestAdminLoopbackHostOnly checks that without admin.token the admin listener answers only
// requests addressed to a loopback name. That holds for every path, such as /healthz,
// /readyz, /metrics and the console. A foreign Host, as DNS rebinding sends it, gets 421
// and a fixed text. The same request for localhost, 127.0.0.1 or [::1] is served. With a
// token the bearer check guards instead, and a probe of the pod's IP reaches /healthz.
func TestAdminLoopbackHostOnly(t *testing.T) {
	testenv.Integration(t)
	base := startTestAdminWith(t, testenv.Kafka(t), metrics.New(nil))
	addr := strings.TrimPrefix(base, "http://")
	_, port, _ := net.SplitHostPort(addr)
	paths := []string{"/healthz", "/readyz", "/metrics", "/", "/inbox", "/static/console.css", "/login", "/no-such-page"}
	for _, path := range paths {
		for _, host := range foreignHosts(port) {
			code, body, ctype := hostGet(t, http.MethodGet, addr, path, host, nil, nil)
			if code != http.StatusMisdirectedRequest || body != loopback.Message+"\n" || !strings.HasPrefix(ctype, "text/plain") {
				t.Errorf("GET %s Host %s: %d %s %q, want 421 and the fixed text", path, host, code, ctype, body)
			}
		}
		for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "LocalHost:" + port} {
			if code, body, _ := hostGet(t, http.MethodGet, addr, path, host, nil, nil); code == http.StatusMisdirectedRequest {
				t.Errorf("GET %s Host %s: 421, want it served: %q", path, host, body)
			}
		}
	}
	for name, want := range map[string]string{"/healthz": "ok\n", "/metrics": "go_goroutines"} {
		if code, body, _ := hostGet(t, http.MethodGet, addr, name, "127.0.0.1:"+port, nil, nil); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s for 127.0.0.1: %d, want 200 with %q", name, code, want)
		}
	}
	// A POST of the console is refused before its form is read. An absolute request URI
	// names the host it asks for, whatever the Host header says. An HTTP/1.0 request
	// without a Host is refused too.
	if code, _, _ := hostGet(t, http.MethodPost, addr, "/logout", "rebind.example:"+port, strings.NewReader("csrf=x"),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"}); code != http.StatusMisdirectedRequest {
		t.Errorf("POST /logout for rebind.example: %d, want 421", code)
	}
	for _, req := range []string{
		"GET http://rebind.example:" + port + "/metrics HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\nConnection: close\r\n\r\n",
		"GET /metrics HTTP/1.0\r\n\r\n",
	} {
		if line := rawRequest(t, addr, req); !strings.Contains(line, " 421 ") {
			t.Errorf("%q: %s, want 421", req, line)
		}
	}

	d := testenv.DB(t, 2)
	taddr := freeAddr(t)
	_, tport, _ := net.SplitHostPort(taddr)
	const token = "s3cret-token-0123456789"
	a := &Setup{Config: Config{Admin: AdminConfig{Listen: taddr, Token: token}}, logger: watermill.NopLogger{}}
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := a.startAdmin(ctx, d.DB, testenv.Kafka(t), metrics.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); stop() })
	if code, body, _ := hostGet(t, http.MethodGet, taddr, "/healthz", "10.0.0.5:"+tport, nil, nil); code != http.StatusOK || body != "ok\n" {
		t.Errorf("with a token, /healthz for the pod's IP: %d %q, want 200 ok", code, body)
	}
	if code, _, _ := hostGet(t, http.MethodGet, taddr, "/metrics", "10.0.0.5:"+tport, nil, map[string]string{"Authorization": "Bearer " + token}); code != http.StatusOK {
		t.Errorf("with a token, /metrics for the pod's IP with the token: %d, want 200", code)
	}
}

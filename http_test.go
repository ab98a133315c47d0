package onceflow

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/loopback"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
)

// The HTTP commands' listener follows the admin listener's rules: beyond loopback only with
// a token (bad input before anything starts, one line naming the key), a token of at least 16
// printable characters, from http.token or http.token_file but not both.
func TestHTTPListenNeedsToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		http HTTPConfig
		want string // "" valid
	}{
		{HTTPConfig{Listen: ""}, ""},
		{HTTPConfig{Listen: "127.0.0.1:8080"}, ""},
		{HTTPConfig{Listen: "localhost:8080"}, ""},
		{HTTPConfig{Listen: "0.0.0.0:8080"}, `http.listen "0.0.0.0:8080" is reachable beyond this machine`},
		{HTTPConfig{Listen: ":8080"}, "set http.token"},
		{HTTPConfig{Listen: "0.0.0.0:8080", Token: "short"}, "http.token: want at least 16"},
		{HTTPConfig{Listen: "0.0.0.0:8080", Token: "s3cret-token-0123456789"}, ""},
		{HTTPConfig{Listen: "0.0.0.0:8080", TokenFile: tokenFile}, ""},
		{HTTPConfig{Listen: "0.0.0.0:8080", TokenFile: filepath.Join(dir, "missing")}, "http.token_file"},
		{HTTPConfig{Listen: "0.0.0.0:8080", Token: "s3cret-token-0123456789", TokenFile: tokenFile}, "set one, not both"},
		{HTTPConfig{Listen: "8080"}, "want host:port"},
	} {
		err := tc.http.validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.http, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error with %q", tc.http, err, tc.want)
		}
	}
	cfg := filepath.Join(dir, "open.yaml")
	if err := os.WriteFile(cfg, []byte("http:\n  listen: 0.0.0.0:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := runRouter(context.Background(), cfg, "run")
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "http.token") {
		t.Fatalf("run with http.listen 0.0.0.0 and no token: %v (bad input: %t), want bad input naming http.token", err, isBadInput(err))
	}
	for _, bad := range []string{"http:\n  max_body_bytes: 0\n", "http:\n  request_timeout: 1ns\n", "http:\n  idempotency_ttl: 1s\n"} {
		if err := os.WriteFile(cfg, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := runRouter(context.Background(), cfg, "run"); err == nil || !isBadInput(err) {
			t.Errorf("%q: %v (bad input: %t), want bad input", bad, err, isBadInput(err))
		}
	}
}

// With http.token, a command without the bearer token is answered 401 with a JSON error and
// never reaches the handler.
func TestHTTPBearer(t *testing.T) {
	reached := 0
	h := requireBearer("s3cret-token-0123456789", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reached++ }))
	for _, auth := range []string{"", "Bearer wrong", "s3cret-token-0123456789", "Bearer s3cret-token-0123456789x"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/claims", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		h.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != http.StatusUnauthorized || !strings.Contains(string(body), `"error"`) || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("Authorization %q: %d %s", auth, rec.Code, body)
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/claims", nil)
	req.Header.Set("Authorization", "Bearer s3cret-token-0123456789")
	h.ServeHTTP(rec, req)
	if reached != 1 {
		t.Fatalf("the right token reached the handler %d times, want 1", reached)
	}
}

// Without http.token the commands' listener answers only requests addressed to a loopback
// name: a claim whose Host is another name (a page re-pointing its DNS name to 127.0.0.1)
// gets 421 and a fixed JSON error and writes nothing; the same claim for localhost,
// 127.0.0.1 or [::1] is granted.
func TestHTTPCommandsLoopbackHostOnly(t *testing.T) {
	testenv.Integration(t)
	reg, err := pluginRegistry([]inbox.Plugin{coupon.Plugin()})
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.DB(t, 4, migrationSets(reg)...)
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	cfg := DefaultConfig()
	cfg.HTTP.Listen = addr
	a := &Setup{Config: cfg, logger: watermill.NopLogger{}, plugins: reg}
	ps, err := a.Plugins()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := a.startHTTP(ctx, d.DB, ps, nil, metrics.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); stop() })

	n := 0
	claim := func(host string) (int, string, string) {
		t.Helper()
		n++
		body := fmt.Sprintf(`{"userId":"u-%d","campaignId":%q}`, n, coupon.DefaultConfig().CampaignID)
		return hostGet(t, http.MethodPost, addr, coupon.ClaimPath, host, strings.NewReader(body),
			map[string]string{"Content-Type": "application/json", "Idempotency-Key": fmt.Sprintf("rebind-%d", n)})
	}
	for _, host := range foreignHosts(port) {
		code, body, ctype := claim(host)
		if code != http.StatusMisdirectedRequest || ctype != "application/json" || body != `{"error":"`+loopback.Message+`"}`+"\n" {
			t.Errorf("claim for Host %s: %d %s %q, want 421 and the fixed JSON error", host, code, ctype, body)
		}
	}
	for _, req := range []string{
		"POST http://rebind.example:" + port + coupon.ClaimPath + " HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\nIdempotency-Key: rebind-abs\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
		"POST " + coupon.ClaimPath + " HTTP/1.0\r\nIdempotency-Key: rebind-nohost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
	} {
		if line := rawRequest(t, addr, req); !strings.Contains(line, " 421 ") {
			t.Errorf("%q: %s, want 421", req, line)
		}
	}
	if rows := dbCount(t, d.DB, "SELECT COUNT(*) FROM inbox"); rows != 0 {
		t.Fatalf("refused claims wrote %d inbox rows", rows)
	}
	hosts := []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port}
	for _, host := range hosts {
		if code, body, _ := claim(host); code != http.StatusCreated {
			t.Errorf("claim for Host %s: %d %q, want 201", host, code, body)
		}
	}
	if c := dbCount(t, d.DB, "SELECT COUNT(*) FROM user_coupon"); c != len(hosts) {
		t.Errorf("%d coupons, want %d (one per claim for a loopback name)", c, len(hosts))
	}
}

func dbCount(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// The HTTP part says on /metrics whether it serves the commands: onceflow_http_commands_enabled
// is 0 with http.listen empty, the default, and 1 once the listener serves them. The
// dashboard's HTTP panels say "not enabled" from it.
func TestHTTPCommandsEnabledGauge(t *testing.T) {
	testenv.Integration(t)
	reg, err := pluginRegistry([]inbox.Plugin{coupon.Plugin()})
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.DB(t, 4, migrationSets(reg)...)
	for _, listen := range []string{"", freeAddr(t)} {
		cfg := DefaultConfig()
		cfg.HTTP.Listen = listen
		a := &Setup{Config: cfg, logger: watermill.NopLogger{}, plugins: reg}
		ps, err := a.Plugins()
		if err != nil {
			t.Fatal(err)
		}
		m := metrics.New(nil)
		ctx, cancel := context.WithCancel(context.Background())
		stop, err := a.startHTTP(ctx, d.DB, ps, nil, m)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		cancel()
		stop()
		want := "\nonceflow_http_commands_enabled 1\n"
		if listen == "" {
			want = "\nonceflow_http_commands_enabled 0\n"
		}
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("http.listen %q: /metrics lacks %q", listen, strings.TrimSpace(want))
		}
	}
}

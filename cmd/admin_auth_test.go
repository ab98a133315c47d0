package onceflowcmd

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/metrics"
	"github.com/onceflow/onceflow/pkg/testenv"
)

// An admin listener beyond loopback without a token is refused before anything starts
// (exit 2, one line naming the key); a token that is too short is refused too; loopback
// needs none.
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

	// Through the command line: exit 2 before anything connects.
	cfg := filepath.Join(dir, "open.yaml")
	if err := os.WriteFile(cfg, []byte("admin:\n  listen: 0.0.0.0:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Run(context.Background(), []string{"--config", cfg, "run"})
	if err == nil || ExitCode(err) != 2 || !strings.Contains(err.Error(), "admin.token") {
		t.Fatalf("run with an open admin listener and no token: %v (exit %d), want exit 2 naming admin.token", err, ExitCode(err))
	}
}

// With a token, /metrics and /readyz answer 401 without it or with a wrong one, and serve
// with it; /healthz stays open (liveness). The server has all four timeouts.
func TestAdminToken(t *testing.T) {
	d := testenv.DB(t, 2)
	addr := freeAddr(t)
	const token = "s3cret-token-0123456789"
	a := &app{cfg: Config{Admin: AdminConfig{Listen: addr, Token: token}}, logger: watermill.NopLogger{}}
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

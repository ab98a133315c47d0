package httpcmd_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

// routerChildEnv set to 1 makes this test binary a `router run` process, the stock
// router's main with the coupon plugin. So the test kills a real router with SIGKILL.
const routerChildEnv = "HTTPCMD_TEST_ROUTER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(routerChildEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := routercmd.Run(ctx, os.Args[1:])
		stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "router: %v\n", err)
			os.Exit(routercmd.ExitCode(err))
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type routerProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startRouter(t *testing.T, config string) *routerProc {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.CreateTemp(t.TempDir(), "router-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", config)
	cmd.Dir = t.TempDir()
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCEFLOW_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, routerChildEnv+"=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &routerProc{cmd: cmd, log: logf.Name(), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() { p.kill(); <-p.done })
	return p
}

func (p *routerProc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
}

func (p *routerProc) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// waitHTTP waits until the router answers on its HTTP command listener.
func (p *routerProc) waitHTTP(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("router exited before serving:\n%s", p.tail())
		default:
		}
		if resp, err := http.Get(url + coupon.ClaimPath); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("router not serving %s within 60s:\n%s", url, p.tail())
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestClaimsSurviveKill9 kills a router with SIGKILL between requests, and again in the
// middle of a burst of them. It loses no committed claim and repeats none. After a
// restart every client retries with its key until it gets an answer. Each key holds
// exactly one coupon and one event. The answers given before the kill are given again,
// byte for byte.
func TestClaimsSurviveKill9(t *testing.T) {
	d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	kc := testenv.Kafka(t)
	in := testenv.Topic(t, kc, "httpcmd-order-paid", 1)
	granted := testenv.Topic(t, kc, "httpcmd-granted", 1)
	failed := testenv.Topic(t, kc, "httpcmd-failed", 1)
	addr := freeAddr(t)
	url := "http://" + addr
	config := filepath.Join(t.TempDir(), "router.yaml")
	yaml := fmt.Sprintf(`db:
  dsn: %q
kafka:
  brokers: [%q]
relay:
  enabled: false
admin:
  listen: ""
http:
  listen: %q
plugins:
  coupon-granter:
    topics: [%q]
    consumer_group: %q
    granted_topic: %q
    failed_topic: %q
`, d.DSN, kc.Brokers[0], addr, in, "httpcmd-"+d.Name, granted, failed)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	r := startRouter(t, config)
	r.waitHTTP(t, url)
	// Between requests, 30 claims are answered, then the router gets SIGKILL.
	first := map[string]string{}
	for i := range 30 {
		key := fmt.Sprintf("before-%02d", i)
		a := claim(t, c, url, key, claimBody("u-"+key))
		if a.status != http.StatusCreated {
			t.Fatalf("claim %s: %d %s", key, a.status, a.body)
		}
		first[key] = a.body
	}
	r.kill()
	<-r.done

	r = startRouter(t, config)
	r.waitHTTP(t, url)
	// In the middle of a burst, 60 clients each send one claim, and the router is killed
	// while they run. The ones cut off get a connection error.
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 2 * time.Millisecond)
			key := fmt.Sprintf("during-%02d", i)
			req, _ := http.NewRequest(http.MethodPost, url+coupon.ClaimPath, strings.NewReader(claimBody("u-"+key)))
			req.Header.Set("Idempotency-Key", key)
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
				mu.Lock()
				answered++
				mu.Unlock()
			}
		}()
	}
	time.Sleep(60 * time.Millisecond)
	r.kill()
	<-r.done
	wg.Wait()
	t.Logf("burst: %d of 60 requests answered before the kill", answered)

	r = startRouter(t, config)
	r.waitHTTP(t, url)
	// Every client retries with its key until answered 201.
	retry := func(key string) answer {
		for range 50 {
			a := claim(t, c, url, key, claimBody("u-"+key))
			if a.status != http.StatusConflict && a.status != http.StatusServiceUnavailable && a.status != http.StatusGatewayTimeout {
				return a
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("key %s: no answer after 50 tries", key)
		return answer{}
	}
	for key, body := range first {
		a := retry(key)
		if a.status != http.StatusCreated || a.body != body || !a.replayed {
			t.Fatalf("retry of %s after the kill: %d %s replayed=%v, want the first answer %s", key, a.status, a.body, a.replayed, body)
		}
	}
	for i := range 60 {
		key := fmt.Sprintf("during-%02d", i)
		if a := retry(key); a.status != http.StatusCreated {
			t.Fatalf("retry of %s: %d %s", key, a.status, a.body)
		}
	}
	for i := range 30 {
		for _, key := range []string{fmt.Sprintf("before-%02d", i), fmt.Sprintf("during-%02d", i), fmt.Sprintf("during-%02d", i+30)} {
			if n, e := coupons(t, d.DB, "u-"+key), events(t, d.DB, "u-"+key); n != 1 || e != 1 {
				t.Fatalf("key %s: %d coupons, %d events; want 1 and 1", key, n, e)
			}
		}
	}
	if n := count(t, d.DB, "SELECT COUNT(*) FROM user_coupon"); n != 90 {
		t.Fatalf("coupons: %d, want 90", n)
	}
}

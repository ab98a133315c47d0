package opscheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/tools/internal/orderfeed"
)

// expectMissingEnv names metrics (comma-separated) whose panels may return no series: the
// check then lists them without failing. Nothing sets it by default.
const expectMissingEnv = "OFTEST_OPSCHECK_EXPECT_MISSING"

// The panels' template variables, as the check substitutes them.
var templateVars = strings.NewReplacer(
	"$__rate_interval", "30s",
	"$__range", "5m",
	"${biz_type:regex}", ".*",
	"${biz_type}", ".*",
	"$biz_type", ".*",
)

// TestDashboardQueriesAndRules runs a router and Debian's Prometheus scraping it with the
// alert rules loaded, then evaluates every query of every dashboard panel: each must answer
// with at least one series. The rules must load with health ok.
func TestDashboardQueriesAndRules(t *testing.T) {
	testenv.Integration(t)
	root := repoRoot(t)
	promBin := lookPath(t, "prometheus")
	router := routerBin(t, root)

	// The router: its own database and topics, orders that succeed, fail (one attempt,
	// a downstream failing 30 % of calls), repeat, and deliveries held behind failed keys;
	// HTTP commands on http.listen.
	d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	kc := testenv.Kafka(t)
	in := testenv.Topic(t, kc, "ops-orders", 2)
	granted := testenv.Topic(t, kc, "ops-granted", 1)
	failed := testenv.Topic(t, kc, "ops-grant-failed", 1)
	admin, httpAddr := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "router.yaml")
	writeFile(t, cfg, fmt.Sprintf(`db:
  dsn: %q
kafka:
  brokers: [%q]
admin:
  listen: %q
http:
  listen: %q
inbox:
  max_attempts: 1
  delayed_retries: 1
  delayed_backoff: 1s
plugins:
  coupon-granter:
    topics: [%q]
    consumer_group: %q
    granted_topic: %q
    failed_topic: %q
    step_failure_rate: 0.3
    seed: 7
`, d.DSN, kc.Brokers[0], admin, httpAddr, in, "ops-"+in, granted, failed))
	routerExited := startProcess(t, filepath.Join(dir, "router.log"), router, "--config", cfg, "run", "--plugins", "coupon-granter")
	waitFor(t, "the router's admin listener", func() bool {
		if routerExited() {
			t.Fatal("the router exited")
		}
		return get("http://"+admin+"/healthz") == nil
	})

	var orders []string
	for i := range 60 {
		orders = append(orders, fmt.Sprintf("o-ops-%s-%02d", watermill.NewShortUUID(), i))
	}
	orderfeed.Send(t, kc, in, append(orders, orders[:10]...)...)
	var failedKeys []string
	waitFor(t, "every order done or failed", func() bool {
		var n int
		if d.DB.QueryRow("SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND status IN ('done', 'failed')", coupon.BizType).Scan(&n) != nil || n < len(orders) {
			return false
		}
		rows, err := d.DB.Query("SELECT dedup_key FROM inbox WHERE biz_type = ? AND status = 'failed'", coupon.BizType)
		if err != nil {
			return false
		}
		defer rows.Close()
		failedKeys = failedKeys[:0]
		for rows.Next() {
			var k string
			if rows.Scan(&k) == nil {
				failedKeys = append(failedKeys, k)
			}
		}
		return rows.Err() == nil
	})
	if len(failedKeys) == 0 {
		t.Fatal("no order failed: the quarantine panels would have no series (step_failure_rate too low for this seed?)")
	}
	orderfeed.Send(t, kc, in, failedKeys[0]) // held: its key is quarantined or waits for its redelivery
	sendPoison(t, kc, in)                    // quarantined at once, whatever the redeliveries do
	for i := range 3 {
		body := fmt.Sprintf(`{"userId":"u-ops-%d","campaignId":"c-ops"}`, i)
		req, _ := http.NewRequest("POST", "http://"+httpAddr+coupon.ClaimPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", watermill.NewUUID())
		if resp, err := http.DefaultClient.Do(req); err != nil {
			t.Fatalf("POST %s: %v", coupon.ClaimPath, err)
		} else {
			resp.Body.Close()
		}
	}

	// Prometheus: its own data dir and port, scraping the admin listener every second, the
	// alert rules loaded.
	rules := filepath.Join(root, "deploy/prometheus/onceflow-alerts.yml")
	prom := freeAddr(t)
	promCfg := filepath.Join(dir, "prometheus.yml")
	writeFile(t, promCfg, fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
  external_labels:
    onceflow_console: http://%s
rule_files: [%q]
scrape_configs:
  - job_name: onceflow
    static_configs:
      - targets: [%q]
`, admin, rules, admin))
	promExited := startProcess(t, filepath.Join(dir, "prometheus.log"), promBin, "--config.file="+promCfg,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+prom, "--log.level=warn")
	api := "http://" + prom
	waitFor(t, "Prometheus ready", func() bool {
		if promExited() {
			t.Fatal("prometheus exited")
		}
		return get(api+"/-/ready") == nil
	})
	waitFor(t, "a held delivery and 15 scrapes of the router", func() bool {
		held, _ := query(api, `onceflow_inbox_deliveries_total{outcome="held"}`)
		scrapes, _ := query(api, `count_over_time(up{job="onceflow"}[1m]) >= 15`)
		up, _ := query(api, `up{job="onceflow"} == 1`)
		return len(held) > 0 && len(scrapes) > 0 && len(up) > 0
	})

	checkRules(t, api, rules)

	expected := map[string]bool{}
	for _, m := range strings.Split(os.Getenv(expectMissingEnv), ",") {
		if m = strings.TrimSpace(m); m != "" {
			expected[m] = true
		}
	}
	var empty, allowed []string
	n := 0
	for _, p := range dashboardQueries(t, filepath.Join(root, "deploy/grafana/onceflow-dashboard.json")) {
		n++
		q := templateVars.Replace(p.expr)
		res, err := query(api, q)
		switch {
		case err != nil:
			t.Errorf("panel %q, query %s: %v", p.panel, p.refID, err)
		case len(res) == 0 && mentionsAny(q, expected):
			allowed = append(allowed, fmt.Sprintf("%q %s", p.panel, p.refID))
		case len(res) == 0:
			empty = append(empty, fmt.Sprintf("panel %q, query %s: %s", p.panel, p.refID, q))
		default:
			t.Logf("ok: panel %q, query %s: %d series", p.panel, p.refID, len(res))
		}
	}
	if len(allowed) > 0 {
		t.Logf("no series, as %s allows: %s", expectMissingEnv, strings.Join(allowed, ", "))
	}
	if len(empty) > 0 {
		t.Errorf("%d of %d dashboard queries returned no series (%s names metrics allowed to be missing):\n  %s",
			len(empty), n, expectMissingEnv, strings.Join(empty, "\n  "))
	}
}

// checkRules asks Prometheus for its rules: every alert of the file loaded, each with
// health ok.
func checkRules(t *testing.T, api, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := len(regexp.MustCompile(`(?m)^\s*- alert: `).FindAll(b, -1))
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					Type      string `json:"type"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	var got int
	waitFor(t, "every alert rule evaluated", func() bool {
		if getJSON(api+"/api/v1/rules", &resp) != nil || resp.Status != "success" {
			return false
		}
		got = 0
		for _, g := range resp.Data.Groups {
			for _, r := range g.Rules {
				if r.Health == "unknown" {
					return false
				}
				got++
			}
		}
		return got > 0
	})
	if got != want {
		t.Errorf("Prometheus loaded %d rules, the file has %d alerts", got, want)
	}
	for _, g := range resp.Data.Groups {
		for _, r := range g.Rules {
			if r.Health != "ok" {
				t.Errorf("rule %s: health %s: %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	t.Logf("rules: %d loaded, health ok", got)
}

type panelQuery struct{ panel, refID, expr string }

// dashboardQueries returns every target's expr of every panel (rows' nested panels too).
func dashboardQueries(t *testing.T, file string) []panelQuery {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []panelQuery
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q, query %s: no expr", p.Title, tg.RefID)
					continue
				}
				out = append(out, panelQuery{p.Title, tg.RefID, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	if len(out) == 0 {
		t.Fatalf("%s: no panel queries", file)
	}
	return out
}

var metricName = regexp.MustCompile(`onceflow_[a-z_]+`)

// mentionsAny reports whether q reads one of the metrics in names (a histogram's
// _bucket/_sum/_count series count as the histogram's name).
func mentionsAny(q string, names map[string]bool) bool {
	for _, m := range metricName.FindAllString(q, -1) {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
		if names[m] || names[base] {
			return true
		}
	}
	return false
}

// query runs an instant query and returns its result vector.
func query(api, q string) ([]json.RawMessage, error) {
	var resp struct {
		Status    string `json:"status"`
		Error     string `json:"error"`
		ErrorType string `json:"errorType"`
		Data      struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(api+"/api/v1/query?query="+url.QueryEscape(q), &resp); err != nil {
		return nil, err
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("%s: %s", resp.ErrorType, resp.Error)
	}
	return resp.Data.Result, nil
}

var client = &http.Client{Timeout: 10 * time.Second}

func getJSON(u string, v any) error {
	resp, err := client.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func get(u string) error {
	resp, err := client.Get(u)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	return nil
}

// startProcess runs a command with its output in logFile; the test's cleanup stops it
// (SIGTERM, then SIGKILL after 30 s) and shows the log's tail when the test failed. The
// returned func reports whether the process has exited.
func startProcess(t *testing.T, logFile, bin string, args ...string) (exited func() bool) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s did not stop on SIGTERM within 30 s: killed", filepath.Base(bin))
		}
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("%s log (last lines):\n%s", filepath.Base(bin), strings.Join(lines[max(0, len(lines)-20):], "\n"))
		}
	})
	return func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}

// sendPoison sends a record no decoder accepts (not JSON): quarantined as poison.
func sendPoison(t *testing.T, kc kafkax.Config, topic string) {
	t.Helper()
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("o-ops-poison"), Value: sarama.StringEncoder("not json")}); err != nil {
		t.Fatal(err)
	}
}

// repoRoot is the checkout this module belongs to (tools/ is one level down).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(wd))
}

// routerBin is $OFTEST_ROUTER_BIN, else the router built from the checkout.
func routerBin(t *testing.T, root string) string {
	t.Helper()
	if p := os.Getenv("OFTEST_ROUTER_BIN"); p != "" {
		return p
	}
	out := filepath.Join(t.TempDir(), "router")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/router")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/router: %v\n%s", err, b)
	}
	return out
}

func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("no %s on the PATH: `bash scripts/ops-test.sh install` (apt-get install prometheus) installs it", name)
	}
	return p
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

func writeFile(t *testing.T, name, body string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

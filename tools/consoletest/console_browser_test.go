package consoletest_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/chromedp/chromedp"
	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/routercmd"
	"github.com/onceflow/onceflow/tools/internal/orderfeed"
)

// screenshotsEnv names a directory: when set, the browser test saves the console's
// overview and row pages there as console-overview.png and console-row.png (docs/ holds
// the ones the documents show: OFTEST_CONSOLE_SCREENSHOTS=$PWD/docs).
const screenshotsEnv = "OFTEST_CONSOLE_SCREENSHOTS"

// chromium returns the headless browser the console's browser test drives: $OFTEST_CHROMIUM,
// else Debian's chromium on the PATH. A missing browser fails the test (it is part of what
// `make test` proves), saying how to install it.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OFTEST_CHROMIUM"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("OFTEST_CHROMIUM=%s: %v", p, err)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no headless Chromium for the console's browser test: install it with `apt-get update && apt-get install -y chromium` " +
		"(scripts/infra.sh up does), or set OFTEST_CHROMIUM to a Chrome or Chromium binary; `go test -short` skips this test")
	return ""
}

// The operator console in a real browser, the way an operator recovers a message: the
// coupon plugin's downstream fails (step_failure_rate 0.99, two attempts) and its order is
// quarantined; the downstream is fixed and the router restarted; the operator logs in with
// the admin token, finds the failed row, opens it (payload, error, attempts), presses
// retry, and sees the row done with the grant's state-machine history; the retry is in the
// replay table as `router inbox retry` records it.
func TestConsoleRetryInBrowser(t *testing.T) {
	testenv.Integration(t)
	browser := chromium(t)
	d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	kc := testenv.Kafka(t)
	in := testenv.Topic(t, kc, "console-orders", 2)
	granted := testenv.Topic(t, kc, "console-granted", 1)
	failedTopic := testenv.Topic(t, kc, "console-grant-failed", 1)
	group := "console-" + in
	reg := []inbox.Plugin{coupon.Plugin()}

	addr := freeLoopbackAddr(t)
	base := "http://" + addr
	const token = "console-test-token-0123456789"
	mc, err := mysql.ParseDSN(testenv.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	mc.DBName = d.Name
	cfgFile := filepath.Join(t.TempDir(), "router.yaml")
	writeConfig := func(failureRate string) {
		t.Helper()
		body := fmt.Sprintf(`db:
  dsn: %q
  admin_dsn: %q
kafka:
  brokers: [%q]
admin:
  listen: %q
  token: %q
inbox:
  max_attempts: 2
  backoff_initial: 10ms
  backoff_max: 50ms
  delayed_retries: 0 # quarantined at once: the drill replays quarantined rows
plugins:
  coupon-granter:
    topics: [%q]
    consumer_group: %q
    granted_topic: %q
    failed_topic: %q
    step_failure_rate: %s
    seed: 42
`, d.DSN, mc.FormatDSN(), kc.Brokers[0], addr, token, in, group, granted, failedTopic, failureRate)
		if err := os.WriteFile(cfgFile, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	startRouter := func() (stop func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- routercmd.Run(ctx, []string{"--config", cfgFile, "run"}, routercmd.WithPlugins(reg...))
		}()
		waitUntil(t, "the admin listener", func() bool {
			c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		var once bool
		return func() {
			if once {
				return
			}
			once = true
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("router run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Error("router did not stop")
			}
		}
	}
	status := func(key string) string {
		var s string
		if err := d.DB.QueryRow("SELECT status FROM inbox WHERE biz_type = ? AND dedup_key = ?", coupon.BizType, key).Scan(&s); err != nil {
			return ""
		}
		return s
	}

	// The downstream fails: the order is quarantined after its two attempts.
	order := "o-console-" + watermill.NewShortUUID()
	writeConfig("0.99")
	orderfeed.Send(t, kc, in, order)
	stop := startRouter()
	waitUntil(t, "the order quarantined", func() bool { return status(order) == "failed" })
	waitUntil(t, "the group to commit its offsets", func() bool {
		for _, lag := range testenv.CommittedLag(t, kc, group, in) {
			if lag != 0 {
				return false
			}
		}
		return true
	})
	stop()

	// Fixed: the router runs again with the downstream healthy, and other orders flow
	// (some delivered twice) so the overview has deliveries to show.
	writeConfig("0")
	stop = startRouter()
	t.Cleanup(stop)
	var others []string
	for i := range 120 {
		others = append(others, fmt.Sprintf("%s-%03d", order, i))
	}
	orderfeed.Send(t, kc, in, append(others, others[:40]...)...)
	waitUntil(t, "the other orders granted and their duplicates blocked", func() bool {
		var n, dups int
		return d.DB.QueryRow("SELECT COUNT(*), COALESCE(SUM(duplicates), 0) FROM inbox WHERE biz_type = 'coupon' AND status = 'done'").Scan(&n, &dups) == nil &&
			n == len(others) && dups == 40
	})
	if s := status(order); s != "failed" {
		t.Fatalf("the quarantined order is %q before the retry, want failed", s)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelTimeout()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("browser: %s: %v", what, err)
		}
	}
	text := func(sel chromedp.CSS) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		must("text of "+string(sel), err)
		return strings.TrimSpace(s)
	}

	// A console page without a login goes to the login form, and back after it.
	must("open the failed rows", chromedp.Do(ctx, chromedp.Navigate(base+"/inbox?status=failed"), chromedp.WaitVisible(chromedp.ID("token"))))
	must("log in", chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("login")), chromedp.WaitVisible(chromedp.ID("rows"))))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	must("location", err)
	if !strings.HasSuffix(loc, "/inbox?status=failed") {
		t.Fatalf("after the login the browser is at %s, want the page it asked for", loc)
	}
	if got := text("#rows tbody td.key a"); got != order {
		t.Fatalf("the failed rows list %q first, want the quarantined order %q", got, order)
	}
	if got := text("#match"); !strings.Contains(got, "1 match") {
		t.Errorf("the failed rows' count above them: %q, want 1 match", got)
	}

	// The overview counts it among the failed rows, by reason, and shows the traffic.
	for i := 0; ; i++ { // the process counts a delivery just after its commit
		must("overview", chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("biz"))))
		got := text("#dups-total")
		if got == "40" {
			break
		}
		if i == 50 {
			t.Fatalf("overview: %s duplicates blocked since the start, want 40", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The order's quarantine was the previous process's delivery: the last hour reads it
	// from inbox_history, which that process wrote when it stopped.
	if got := text("#failed-hour"); got != "1" {
		t.Errorf("overview after the restart: %s quarantined or in conflict in the last hour, want the previous process's 1", got)
	}
	if got := text("#biz"); !strings.Contains(got, "retries_exhausted 1") || !strings.Contains(got, "replay these (dry run)") ||
		!strings.Contains(got, "1 × coupon: injected external failure: lock_stock (…:lock_stock)") {
		t.Errorf("overview's inbox table lacks the failed row by reason, its replay, or its error:\n%s", got)
	}
	if got := text("#group-lag"); !strings.Contains(got, in) {
		t.Errorf("overview's consumer groups lack %s:\n%s", in, got)
	}
	if got := text("#partitions"); !strings.Contains(got, in) {
		t.Errorf("overview's partitions lack %s:\n%s", in, got)
	}
	screenshot(t, ctx, "console-overview.png")

	// The row: payload, last error, attempts; then the retry.
	must("open the row", chromedp.Do(ctx, chromedp.Navigate(base+"/inbox?status=failed"), chromedp.WaitVisible(chromedp.ID("rows")),
		chromedp.Click(chromedp.CSS("#rows tbody td.key a")), chromedp.WaitVisible(chromedp.ID("retry"))))
	if got := text("#status"); got != "failed" {
		t.Fatalf("row page: status %q, want failed", got)
	}
	if got := text("#payload"); !strings.Contains(got, `"orderId": "`+order+`"`) {
		t.Errorf("row page: payload not shown pretty-printed:\n%s", got)
	}
	if got := text("#row"); !strings.Contains(got, "injected external failure") || !strings.Contains(got, "retries_exhausted") {
		t.Errorf("row page lacks the last error and the reason:\n%s", got)
	}
	must("retry", chromedp.Do(ctx, chromedp.Click(chromedp.ID("retry")), chromedp.WaitVisible(chromedp.ID("replay-result"))))
	if got := text("#status"); got != "done" {
		t.Fatalf("after the retry the row is %q, want done (%s)", got, text("#replay-result"))
	}
	if got := text("#history"); !strings.Contains(got, "INIT") || !strings.Contains(got, "GRANTED") {
		t.Errorf("row page: the grant's history lacks its transitions:\n%s", got)
	}
	screenshot(t, ctx, "console-row.png")

	// The overview right after the retry counts the row as done, not failed.
	must("overview after the retry", chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("biz"))))
	if got := text("#biz"); strings.Contains(got, "retries_exhausted") {
		t.Errorf("overview after the retry still counts the failed row:\n%s", got)
	}

	// The database agrees, and the retry is recorded as the CLI records one.
	if s := status(order); s != "done" {
		t.Fatalf("inbox row %q after the retry, want done", s)
	}
	var replays, grants int
	if err := d.DB.QueryRow(`SELECT COUNT(*) FROM replay WHERE biz_type = 'coupon' AND dry_run = 0 AND outcome = 'ok' AND selected = 1 AND processed = 1`).Scan(&replays); err != nil || replays != 1 {
		t.Errorf("replay table: %d finished retries of one row (%v), want 1", replays, err)
	}
	if err := d.DB.QueryRow(`SELECT COUNT(*) FROM user_coupon WHERE order_id = ?`, order).Scan(&grants); err != nil || grants != 1 {
		t.Errorf("coupons of the retried order: %d (%v), want 1", grants, err)
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("saved %s", filepath.Join(dir, name))
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

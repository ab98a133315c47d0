// Command opsdrill runs four incidents against real routers and Debian's Prometheus with
// the shipped alert rules, and measures when each pages:
//
//   - the coupon service fails every call for 3 minutes: a page within 3 minutes;
//   - the relay lease holder is frozen (SIGSTOP) for 2 minutes: a page within 2 minutes,
//     whose console link answers while the router is frozen;
//   - 600 poison orders: a page within 5 minutes, then every poison row resolved;
//   - the relay's output topic is deleted: a page within 2 minutes, then the topic
//     recreated, the parked events retried and the lost ones republished.
//
// Two `router run` share a fresh database (onceflow_t_opsdrill_*), topics and consumer group
// of their own, and a local downstream (tools/downstream) for the coupon steps, under a
// steady load of `router produce` segments. Prometheus scrapes them with the intervals of
// deploy/prometheus/prometheus.yml and loads deploy/prometheus/onceflow-alerts.yml, without
// an onceflow_console label. The drill polls its alerts every second. Each incident must
// page with its alert within its time; after its fix no alert may start firing, and all
// must end. The run must end exactly-once: `router verify --kafka` over every order of the
// load (the deleted topic's events are sent again by `router outbox republish`, under their
// event ids). The last line is
//
//	DRILL ok incidents=4 coupon_outage=… relay_frozen=… poison=… topic_deleted=… verify=ok
//
// or DRILL FAIL naming what failed. `make ops-drill` (scripts/ops-drill.sh) builds the
// binaries, installs Prometheus when missing and runs it; it takes about half an hour.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// errReported is a failure the DRILL line already names.
var errReported = errors.New("drill failed")

type options struct {
	root       string
	router     string
	downstream string
	prometheus string
	brokers    []string
	adminDSN   string
	appUser    string
	rate       int
	dir        string
	keep       bool
	incidents  string
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, errReported) {
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "opsdrill: %v\n", err)
		fmt.Printf("DRILL FAIL %s\n", oneLine(err.Error()))
		os.Exit(1)
	}
}

func run(args []string) error {
	var o options
	var brokers string
	fs := flag.NewFlagSet("opsdrill", flag.ContinueOnError)
	fs.StringVar(&o.root, "root", ".", "the repository's root (deploy/prometheus is read from it)")
	fs.StringVar(&o.router, "router", "bin/router", "the router binary (make build)")
	fs.StringVar(&o.downstream, "downstream", "bin/downstream", "the downstream binary (go build -C tools -o ../bin/downstream ./downstream)")
	fs.StringVar(&o.prometheus, "prometheus", "prometheus", "Prometheus (Debian's package: apt-get install prometheus)")
	fs.StringVar(&brokers, "brokers", "127.0.0.1:9092", "Kafka brokers, comma-separated")
	fs.StringVar(&o.adminDSN, "admin-dsn", "onceflow_admin:onceflow_admin@tcp(127.0.0.1:3306)/", "MariaDB admin DSN without a database: creates the drill's database and migrates it")
	fs.StringVar(&o.appUser, "app-user", "onceflow:onceflow", "the application user:password the routers log in as")
	fs.IntVar(&o.rate, "rate", 20, "steady load: messages per second")
	fs.StringVar(&o.dir, "dir", ".run/opsdrill", "run directory: logs, configs, ledgers, Prometheus's data")
	fs.BoolVar(&o.keep, "keep", false, "keep the database and topics at the end")
	fs.StringVar(&o.incidents, "incidents", "coupon_outage,relay_frozen,poison,topic_deleted", "the incidents to run, in this order")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.brokers = strings.Split(brokers, ",")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := newDrill(o)
	if err != nil {
		return err
	}
	defer d.close()
	if err := d.setup(ctx); err != nil {
		return err
	}
	return d.runIncidents(ctx)
}

// drill is one run: its database, topics, processes and results.
type drill struct {
	o        options
	dir      string
	prefix   string // names the run's database, topics, group and orders
	dbName   string
	adminDSN string
	appDSN   string

	ordersTopic, grantedTopic, failedTopic string

	cfg, promCfg           string
	router                 string // a private copy of the router binary
	downstreamAddr         string
	promAddr               string
	scrapeEvery, evalEvery string

	routers  [2]*routerProc
	down     *proc
	prom     *proc
	w        *watcher
	ld       *load
	cleanups []func()
	stopW    context.CancelFunc
	logOut   io.Writer
	started  time.Time // when the load began
}

type routerProc struct {
	name  string
	admin string
	p     *proc
}

func newDrill(o options) (*drill, error) {
	root, err := filepath.Abs(o.root)
	if err != nil {
		return nil, err
	}
	o.root = root
	for _, p := range []*string{&o.router, &o.downstream} {
		if !filepath.IsAbs(*p) {
			*p = filepath.Join(root, *p)
		}
	}
	if !filepath.IsAbs(o.dir) {
		o.dir = filepath.Join(root, o.dir)
	}
	prom, err := exec.LookPath(o.prometheus)
	if err != nil {
		return nil, fmt.Errorf("no %s on the PATH: apt-get install prometheus (bash scripts/ops-test.sh install)", o.prometheus)
	}
	o.prometheus = prom
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	d := &drill{o: o, prefix: "opsdrill-" + id, dbName: "onceflow_t_opsdrill_" + id, logOut: os.Stderr}
	d.dir = filepath.Join(o.dir, d.prefix)
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return nil, err
	}
	d.ordersTopic, d.grantedTopic, d.failedTopic = d.prefix+"-orders", d.prefix+"-granted", d.prefix+"-failed"
	d.cfg, d.promCfg = filepath.Join(d.dir, "router.yaml"), filepath.Join(d.dir, "prometheus.yml")
	d.ld = &load{d: d, rate: o.rate}
	return d, nil
}

func (d *drill) logf(format string, args ...any) {
	fmt.Fprintf(d.logOut, "%s opsdrill: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// env is the environment of every router command: the drill's configuration.
func (d *drill) env() []string { return []string{"ONCEFLOW_CONFIG=" + d.cfg} }

// setup creates the database and topics, starts the downstream, the two routers and
// Prometheus, and the alert watcher.
func (d *drill) setup(ctx context.Context) error {
	d.logf("run directory %s", d.dir)
	for _, bin := range []string{d.o.router, d.o.downstream} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%s: %w (make build; go build -C tools -o ../bin/downstream ./downstream)", bin, err)
		}
	}
	// A private copy, so that a concurrent `make build` cannot swap the binary mid-run.
	b, err := os.ReadFile(d.o.router)
	if err != nil {
		return err
	}
	d.router = filepath.Join(d.dir, "router")
	if err := os.WriteFile(d.router, b, 0o755); err != nil {
		return err
	}
	if err := d.createDatabase(ctx); err != nil {
		return err
	}
	if err := d.createTopics(); err != nil {
		return err
	}
	if d.downstreamAddr, err = freeAddr(); err != nil {
		return err
	}
	if err := d.writeRouterConfig(); err != nil {
		return err
	}
	if _, err := runCmd(ctx, d.env(), d.router, "migrate"); err != nil {
		return err
	}
	d.logf("database %s migrated; topics %s, %s, %s", d.dbName, d.ordersTopic, d.grantedTopic, d.failedTopic)

	if d.down, err = start(d.dir, "downstream", nil, d.o.downstream, "-listen", d.downstreamAddr, "-delay", "2ms", "-jitter", "3ms"); err != nil {
		return err
	}
	for i := range d.routers {
		admin, err := freeAddr()
		if err != nil {
			return err
		}
		r := &routerProc{name: fmt.Sprintf("r%d", i+1), admin: admin}
		if r.p, err = start(d.dir, r.name, append(d.env(), "ONCEFLOW_ADMIN_LISTEN="+admin), d.router, "run"); err != nil {
			return err
		}
		d.routers[i] = r
	}
	for _, r := range d.routers {
		if err := waitFor(ctx, 90*time.Second, r.name+" ready", func() (bool, error) {
			if r.p.exited() {
				return false, fmt.Errorf("%s exited: %v\n%s", r.name, r.p.err, r.p.tail(20))
			}
			code, err := get("http://" + r.admin + "/readyz")
			return code == 200, err
		}); err != nil {
			return err
		}
	}
	d.logf("routers r1 (%s) and r2 (%s) ready", d.routers[0].admin, d.routers[1].admin)

	if d.promAddr, err = freeAddr(); err != nil {
		return err
	}
	shippedCfg := filepath.Join(d.o.root, "deploy/prometheus/prometheus.yml")
	rules := filepath.Join(d.o.root, "deploy/prometheus/onceflow-alerts.yml")
	if err := d.writePrometheusConfig(shippedCfg, rules); err != nil {
		return err
	}
	if d.prom, err = start(d.dir, "prometheus", nil, d.o.prometheus, "--config.file="+d.promCfg,
		"--storage.tsdb.path="+filepath.Join(d.dir, "tsdb"), "--web.listen-address="+d.promAddr, "--log.level=warn"); err != nil {
		return err
	}
	api := "http://" + d.promAddr
	if err := waitFor(ctx, 60*time.Second, "Prometheus ready", func() (bool, error) {
		if d.prom.exited() {
			return false, fmt.Errorf("prometheus exited: %v\n%s", d.prom.err, d.prom.tail(20))
		}
		code, err := get(api + "/-/ready")
		return code == 200, err
	}); err != nil {
		return err
	}
	d.logf("Prometheus %s: scrape every %s, rules evaluated every %s, %s", api, d.scrapeEvery, d.evalEvery, rules)
	wctx, cancel := context.WithCancel(context.Background())
	d.stopW = cancel
	d.w = newWatcher(api)
	go d.w.run(wctx)
	d.started = time.Now()
	d.ld.start(ctx)
	d.logf("steady load: %d messages/s (router produce segments of %d s)", d.o.rate, segmentSeconds)
	return nil
}

// close stops what the drill started, in reverse order, and drops its database and topics
// unless -keep.
func (d *drill) close() {
	d.ld.stop()
	if d.stopW != nil {
		d.stopW()
	}
	d.prom.stop(10 * time.Second)
	for _, r := range d.routers {
		if r != nil {
			r.p.stop(60 * time.Second)
		}
	}
	d.down.stop(10 * time.Second)
	if d.o.keep {
		d.logf("kept database %s and topics %s-*", d.dbName, d.prefix)
		return
	}
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}

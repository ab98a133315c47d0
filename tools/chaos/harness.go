package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// clock stamps the harness's log lines with the seconds since it started.
type clock struct{ t0 time.Time }

func (c clock) logf(format string, args ...any) {
	fmt.Printf("chaos: [%6.1fs] %s\n", time.Since(c.t0).Seconds(), fmt.Sprintf(format, args...))
}

// harness is one chaos run: what its steps (run, in main.go) set up and share. The setup
// steps fill it in order; from the fleet's start on, the fault goroutines, the producer and
// the slots use it concurrently, through the mutexes and atomics below.
type harness struct {
	clock
	o     options
	p     profile // the profile, without the Kafka faults when Kafka is not proxied
	kinds []string
	root  string  // the repository root, absolute
	info  runInfo // saved as run.json for -check-only

	bin       string // the run's private copy of the router binary
	wantProps string // the server.properties the broker must have been started from

	px, kpx       *proxy // the DB proxy; the Kafka proxy (nil: Kafka not proxied)
	routerBrokers string // what the routers bootstrap from: the Kafka proxy, or the brokers
	routerDBAddr  string // what the routers connect to: the DB proxy, or the galera nodes

	cfgPath, adminDSN, appDSN string
	baseEnv                   []string // of `router migrate` and `router produce`: direct to the database and Kafka
	slots                     []*slot  // routers a, b and c

	infraMu                                    sync.Mutex // one scripts/infra.sh operation at a time
	brokerRestarts, dbRestarts, scheduledKills atomic.Int64
	dbNodeKills                                atomic.Int64 // Galera nodes SIGKILLed (galera profile)

	cl      clusterState  // the cluster faults' counts (profiles with cluster set)
	rssStop chan struct{} // closed when the RSS sampler is to stop (nil: no sampler)
	rssDone chan struct{} // closed by the sampler once it has summarized

	errMu sync.Mutex
	errs  []string // the harness's own failures, reported in the CHAOS line
}

// newHarness creates the run's directory (and .run/chaos/last pointing at it).
func newHarness(c clock, o options, p profile, kinds []string) (*harness, error) {
	root, err := filepath.Abs(o.root)
	if err != nil {
		return nil, err
	}
	info := runInfo{Prefix: fmt.Sprintf("chaos%d-%d", o.seed, time.Now().Unix()), Seed: o.seed, Profile: p.name,
		DB: o.dbName, DBAddr: o.dbAddr, Dialect: o.dialect, Brokers: o.brokers, Started: time.Now().UTC(), NoMisbehaver: p.noMisbehaver}
	if o.runDir == "" {
		o.runDir = filepath.Join(root, ".run", "chaos", info.Prefix)
	}
	if err := os.MkdirAll(o.runDir, 0o755); err != nil {
		return nil, err
	}
	_ = os.Remove(filepath.Join(root, ".run", "chaos", "last"))
	_ = os.Symlink(o.runDir, filepath.Join(root, ".run", "chaos", "last"))
	c.logf("profile %s seed %d prefix %s run dir %s", p.name, o.seed, info.Prefix, o.runDir)
	return &harness{clock: c, o: o, p: p, kinds: kinds, root: root, info: info}, nil
}

// harnessErr records and logs a failure of the harness itself (not of the system under
// test): the run then ends CHAOS FAIL with it.
func (h *harness) harnessErr(format string, args ...any) {
	h.errMu.Lock()
	h.errs = append(h.errs, fmt.Sprintf(format, args...))
	h.errMu.Unlock()
	h.logf("HARNESS ERROR: "+format, args...)
}

// infra runs one scripts/infra.sh operation, its output appended to the run's infra.log.
func (h *harness) infra(args ...string) error {
	what := strings.Join(args, " ")
	out, err := exec.Command("bash", append([]string{filepath.Join(h.root, "scripts", "infra.sh")}, args...)...).CombinedOutput()
	f, _ := os.OpenFile(filepath.Join(h.o.runDir, "infra.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if f != nil {
		fmt.Fprintf(f, "== %s %s (err=%v)\n%s", time.Now().Format(time.RFC3339), what, err, out)
		f.Close()
	}
	return err
}

// restart stops svc (kafka or db) through scripts/infra.sh, keeps it down for down, and
// starts it again (three tries); counter counts the restarts that came back up. The
// database is MariaDB's db-stop/db-start, or PostgreSQL's pg-stop/pg-start.
func (h *harness) restart(svc string, down time.Duration, counter *atomic.Int64) {
	h.infraMu.Lock()
	defer h.infraMu.Unlock()
	cmd := svc
	if svc == "db" && h.o.dialect.IsPostgres() {
		cmd = "pg"
	}
	h.logf("%s: stopping (down for %s)", svc, down.Round(100*time.Millisecond))
	if err := h.infra(cmd + "-stop"); err != nil {
		h.harnessErr("%s-stop: %v (see infra.log)", cmd, err)
	}
	time.Sleep(down)
	for i := 0; ; i++ {
		err := h.infra(cmd + "-start")
		if err == nil {
			break
		}
		if i == 2 {
			h.harnessErr("%s-start failed 3 times: %v (see infra.log)", cmd, err)
			return
		}
		time.Sleep(2 * time.Second)
	}
	counter.Add(1)
	h.logf("%s: back up", svc)
	if svc == "kafka" {
		if got := brokerOrigin(h.o.brokers[0]); got != "" && got != h.wantProps {
			h.harnessErr("after the restart the broker runs from %s, not %s", got, h.wantProps)
		}
	}
}

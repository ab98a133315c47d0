// Command chaos runs `router run` processes against a real MariaDB and Kafka while
// `router produce` sends orders with duplicate deliveries and poison, and meanwhile kills
// routers with SIGKILL, crashes the relay between its Kafka commit and its database mark,
// makes consumers join and leave, restarts the broker and the database (scripts/infra.sh),
// and injects latency, connection resets and a cut between the routers and MariaDB and
// between the routers and Kafka through in-process toxiproxies (proxy.go). After healing and
// draining, an independent checker (checker.go) audits the producer's ledger, the database,
// coupon-granted and the consumer groups' committed offsets, and the run ends with one line:
// `CHAOS ok ...` or `CHAOS FAIL ...`.
//
// Beside the coupon granter every router runs chaos-misbehaver, a test plugin compiled in
// only with -tags onceflow_chaos (cmd/router/chaosplugin_on.go): it consumes the same
// orders in its own group and biz type and panics resp. blocks for ever on the orders
// pkg/chaosplan picks; the checker predicts which and checks they ended quarantined with
// reason panic resp. timeout, and the rest done.
//
// It restarts the services it runs against: scripts/chaos.sh points it at a second instance
// of scripts/infra.sh (ONCEFLOW_RUN_DIR, ONCEFLOW_DB_PORT, ONCEFLOW_KAFKA_PORT, ...), and it
// refuses to restart the default instance (3306 / 9092) unless -allow-shared.
//
//	scripts/chaos.sh                                   # or make chaos; CHAOS_PROFILE=long
//	go run ./cmd/chaos -check-only -run-dir .run/chaos/<run> -inject all   # the checker must FAIL
//
// Every fault time, victim and duration comes from -seed (the order-id prefix also carries
// the start time, so runs never share ids on the shared topics).
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

type profile struct {
	name                                     string
	window                                   time.Duration // faults happen in [warmup, window]
	orders, segments                         int
	rate                                     float64 // messages/s of each produce run
	kills, joins, brokerRestarts, dbRestarts int
	minKills                                 int // kills that must really happen (a scheduled kill finds no router now and then)
	latencies, resets, cuts                  int // DB proxy faults
	kLatencies, kResets, kCuts               int // Kafka proxy faults
	relayCrashes                             int // relay crash points armed (after-kafka-commit)
	drain                                    time.Duration
}

var profiles = map[string]profile{
	"short": {name: "short", window: 100 * time.Second, orders: 3000, segments: 6, rate: 50,
		kills: 6, minKills: 5, joins: 3, brokerRestarts: 1, dbRestarts: 1, latencies: 2, resets: 2, cuts: 1,
		kLatencies: 2, kResets: 2, kCuts: 1, relayCrashes: 1, drain: 150 * time.Second},
	"long": {name: "long", window: 540 * time.Second, orders: 15000, segments: 20, rate: 45,
		kills: 24, minKills: 20, joins: 10, brokerRestarts: 3, dbRestarts: 3, latencies: 5, resets: 6, cuts: 3,
		kLatencies: 5, kResets: 6, kCuts: 3, relayCrashes: 4, drain: 300 * time.Second},
	// broken: a short run for a deliberately broken build (scripts/chaos.sh CHAOS_BROKEN=...):
	// relay crashes between the Kafka commit and the mark, a few other faults, no restarts.
	"broken": {name: "broken", window: 55 * time.Second, orders: 1800, segments: 3, rate: 50,
		kills: 2, minKills: 1, joins: 1, latencies: 1, resets: 1, kLatencies: 1, kResets: 1,
		relayCrashes: 3, drain: 120 * time.Second},
}

// leaseTTL is the relay lease of the run (chaosConfig): a relay-crash fault keeps the other
// routers down a little longer than this, so that the armed router takes the lease.
const leaseTTL = 3 * time.Second

type options struct {
	profile, root, router, runDir, dbName, dbAddr, inject string
	kafkaProxy, kafkaChaos                                string
	routerEnv                                             string
	brokers                                               []string
	seed                                                  uint64
	checkOnly, allowShared                                bool
}

// runInfo is saved next to the run's logs so that `-check-only -run-dir` can audit it again.
type runInfo struct {
	Prefix       string                     `json:"prefix"`
	Seed         uint64                     `json:"seed"`
	Profile      string                     `json:"profile"`
	DB           string                     `json:"db"`
	DBAddr       string                     `json:"db_addr"`
	Brokers      []string                   `json:"brokers"`
	Ledgers      []string                   `json:"ledgers"`
	StartOffsets map[string]map[int32]int64 `json:"start_offsets"`
	Kills        int                        `json:"kills"`
	BrokerRestar int                        `json:"broker_restarts"`
	DBRestarts   int                        `json:"db_restarts"`
	Faults       map[string]string          `json:"faults,omitempty"` // what was injected, by kind
	Started      time.Time                  `json:"started"`
}

const (
	orderTopic   = "order-paid"
	grantedTopic = "coupon-granted"
	group        = "coupon-sender"
	// The misbehaving plugin (cmd/router/chaosplugin_on.go), in routers built with
	// -tags onceflow_chaos.
	routerTags       = "onceflow_chaos"
	misbehaverPlugin = "chaos-misbehaver"
	misbehaverGroup  = "chaos-misbehaver"
	misbehaverBiz    = "chaos"
	// handlerTimeout is the run's inbox.handler_timeout: how long a blocked plugin call holds
	// an attempt. Above what the DB proxy's latency fault (≤ 250 ms per chunk each way, up
	// to 10 s) makes of a step of four round trips, so that only the plugin's own blocks end
	// as timeouts.
	handlerTimeout = 5 * time.Second
	// maxPayloadBytes is the run's inbox.max_payload_bytes: small enough that a value over
	// it fits Kafka's default max message size, so `produce --poison` sends the oversized kind.
	maxPayloadBytes = 256 << 10
)

// poisonKinds are the kinds of poison record the checker must find on order-paid (its own
// names, poisonKindOf): `router produce --poison` cycles through all of them.
var poisonKinds = []string{"bad-json", "tombstone", "empty", "utf8-value", "utf8-key", "utf8-headers", "big-headers", "oversized"}

// runGroups are the consumer groups of the run's routers and what they consume.
var runGroups = []GroupTopic{{group, orderTopic}, {misbehaverGroup, orderTopic}}

var t0 = time.Now()

func logf(format string, args ...any) {
	fmt.Printf("chaos: [%6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	var o options
	var brokers string
	prof := os.Getenv("CHAOS_PROFILE")
	if prof == "" {
		prof = "short"
	}
	flag.StringVar(&o.profile, "profile", prof, "short (~3 min) or long (~12 min); env CHAOS_PROFILE")
	flag.Uint64Var(&o.seed, "seed", envUint("CHAOS_SEED", 1), "seed of every fault time, victim and duration; env CHAOS_SEED")
	flag.StringVar(&o.root, "root", ".", "repository root (scripts/infra.sh)")
	flag.StringVar(&o.router, "router", ".run/chaos/router", "router binary, built with -tags "+routerTags+" (copied into the run directory at start; built if missing)")
	flag.StringVar(&o.runDir, "run-dir", "", "run directory (default .run/chaos/<prefix>); with -check-only: the run to audit")
	flag.StringVar(&o.dbName, "db", "onceflow_chaos", "database of the run (dropped and migrated at start)")
	flag.StringVar(&o.dbAddr, "db-addr", "127.0.0.1:"+envOr("ONCEFLOW_DB_PORT", "3306"), "MariaDB address (default from ONCEFLOW_DB_PORT, as scripts/infra.sh)")
	flag.StringVar(&brokers, "brokers", "127.0.0.1:"+envOr("ONCEFLOW_KAFKA_PORT", "9092"), "Kafka brokers, direct (default from ONCEFLOW_KAFKA_PORT)")
	kchaos, kadv := os.Getenv("ONCEFLOW_KAFKA_CHAOS_PORT"), os.Getenv("ONCEFLOW_KAFKA_CHAOS_ADVERTISED_PORT")
	if kchaos != "" && kadv == "" {
		if n, err := strconv.Atoi(kchaos); err == nil {
			kadv = strconv.Itoa(n + 1)
		}
	}
	if kchaos != "" {
		kchaos = "127.0.0.1:" + kchaos
	}
	if kadv != "" {
		kadv = "127.0.0.1:" + kadv
	}
	flag.StringVar(&o.kafkaChaos, "kafka-chaos-listener", kchaos, "the broker's CHAOS listener (default from ONCEFLOW_KAFKA_CHAOS_PORT); empty: Kafka is not proxied")
	flag.StringVar(&o.kafkaProxy, "kafka-proxy", kadv, "where the Kafka proxy listens = the CHAOS listener's advertised address (default from ONCEFLOW_KAFKA_CHAOS_ADVERTISED_PORT, else CHAOS port + 1)")
	flag.StringVar(&o.routerEnv, "router-env", "", "extra environment of the router processes, comma separated KEY=VALUE (e.g. ONCEFLOW_INBOX_BATCH_SIZE=1)")
	flag.BoolVar(&o.allowShared, "allow-shared", false, "allow restarting the default scripts/infra.sh instance (127.0.0.1:3306 / :9092), which other tests may be using")
	flag.StringVar(&o.inject, "inject", "", "after the run, inject faults into what it left (dup-coupon,lost-order,illegal-transition,dup-event or all): the checker must FAIL")
	flag.BoolVar(&o.checkOnly, "check-only", false, "do not run: audit -run-dir (the last run by default) again")
	flag.Parse()
	o.brokers = strings.Split(brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, o)
	if err != nil {
		fmt.Printf("CHAOS FAIL harness: %v\n", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envUint(name string, def uint64) uint64 {
	var v uint64
	if s := os.Getenv(name); s != "" {
		if _, err := fmt.Sscan(s, &v); err == nil {
			return v
		}
	}
	return def
}

func dsn(user, addr, db string) string {
	return fmt.Sprintf("%s@tcp(%s)/%s?timeout=5s&readTimeout=60s&writeTimeout=60s", user, addr, db)
}

func run(ctx context.Context, o options) (int, error) {
	kinds, err := parseInject(o.inject)
	if err != nil {
		return 2, err
	}
	if o.checkOnly {
		return checkOnly(ctx, o, kinds)
	}
	p, ok := profiles[o.profile]
	if !ok {
		return 2, fmt.Errorf("-profile %q: use short or long", o.profile)
	}
	root, err := filepath.Abs(o.root)
	if err != nil {
		return 2, err
	}
	info := runInfo{Prefix: fmt.Sprintf("chaos%d-%d", o.seed, time.Now().Unix()), Seed: o.seed, Profile: p.name,
		DB: o.dbName, DBAddr: o.dbAddr, Brokers: o.brokers, Started: time.Now().UTC()}
	if o.runDir == "" {
		o.runDir = filepath.Join(root, ".run", "chaos", info.Prefix)
	}
	if err := os.MkdirAll(o.runDir, 0o755); err != nil {
		return 2, err
	}
	_ = os.Remove(filepath.Join(root, ".run", "chaos", "last"))
	_ = os.Symlink(o.runDir, filepath.Join(root, ".run", "chaos", "last"))
	logf("profile %s seed %d prefix %s run dir %s", p.name, o.seed, info.Prefix, o.runDir)

	// The router binary: a private copy, so a concurrent `make build` cannot swap it mid-run.
	routerSrc := o.router
	if !filepath.IsAbs(routerSrc) {
		routerSrc = filepath.Join(root, routerSrc)
	}
	if _, err := os.Stat(routerSrc); err != nil {
		logf("building %s", routerSrc)
		if out, err := exec.Command("go", "build", "-tags", routerTags, "-o", routerSrc, "./cmd/router").CombinedOutput(); err != nil {
			return 2, fmt.Errorf("go build -tags %s ./cmd/router: %v\n%s", routerTags, err, out)
		}
	}
	bin := filepath.Join(o.runDir, "router")
	if b, err := os.ReadFile(routerSrc); err != nil {
		return 2, err
	} else if err := os.WriteFile(bin, b, 0o755); err != nil {
		return 2, err
	}
	if out, err := exec.Command(bin, "plugins").CombinedOutput(); err != nil {
		return 2, fmt.Errorf("%s plugins: %v\n%s", routerSrc, err, out)
	} else if !strings.Contains(string(out), misbehaverPlugin) {
		return 2, fmt.Errorf("router %s has no %s plugin: build it with -tags %s (scripts/chaos.sh does)", routerSrc, misbehaverPlugin, routerTags)
	}

	// The harness restarts MariaDB and Kafka: never the default instance that other tests use.
	if (p.brokerRestarts > 0 || p.dbRestarts > 0) && !o.allowShared {
		if isDefaultInstance(o.dbAddr, "3306") || isDefaultInstance(o.brokers[0], "9092") || os.Getenv("ONCEFLOW_RUN_DIR") == "" {
			return 2, fmt.Errorf("refusing to restart the default scripts/infra.sh instance (db %s, kafka %s, ONCEFLOW_RUN_DIR %q): other tests use it; run through scripts/chaos.sh (a second instance) or pass -allow-shared",
				o.dbAddr, o.brokers[0], os.Getenv("ONCEFLOW_RUN_DIR"))
		}
	}

	// scripts/infra.sh kafka-stop stops the kafka.Kafka of its run dir only, and
	// kafka-start starts this checkout's broker: if the running broker came from another
	// checkout (another ONCEFLOW_RUN_DIR, e.g. a CI tree), a "restart" would swap in a broker
	// with other data, which looks exactly like lost messages. Refuse.
	wantProps := filepath.Join(root, ".run", "kafka", "server.properties")
	if d := os.Getenv("ONCEFLOW_RUN_DIR"); d != "" {
		wantProps = filepath.Join(d, "kafka", "server.properties")
	}
	if p.brokerRestarts > 0 {
		switch got := brokerOrigin(o.brokers[0]); got {
		case wantProps:
		case "":
			logf("WARNING: cannot tell which broker listens on %s (not a local kafka.Kafka?): its restarts may not keep its data", o.brokers[0])
		default:
			return 2, fmt.Errorf("the broker on %s was started from %s, not from this checkout (%s): restarting it through scripts/infra.sh would bring up a broker with other data; stop it with its own infra.sh first",
				o.brokers[0], got, wantProps)
		}
	}

	// Foreign members of the fixed consumer group would take partitions (and our orders) into
	// their own database: say so up front, since the checker would then report lost orders.
	foreign := groupMembers(o.brokers)
	if foreign > 0 {
		logf("WARNING: consumer group %s has %d members before the run (another router consuming %s?): orders they take go to their database and count as lost here", group, foreign, orderTopic)
	}

	// The proxies between the routers and MariaDB, and between the routers and Kafka.
	px, err := newProxy("db", "127.0.0.1:0", o.dbAddr)
	if err != nil {
		return 2, err
	}
	defer px.Close()
	logf("db proxy %s → %s (routers connect through it)", px.Addr(), o.dbAddr)
	routerBrokers := strings.Join(o.brokers, ",")
	var kpx *proxy
	if o.kafkaChaos != "" {
		if p.brokerRestarts > 0 && os.Getenv("ONCEFLOW_KAFKA_CHAOS_PORT") == "" {
			return 2, errors.New("-kafka-chaos-listener without ONCEFLOW_KAFKA_CHAOS_PORT in the environment: scripts/infra.sh kafka-start would restart the broker without its CHAOS listener")
		}
		if kpx, err = newProxy("kafka", o.kafkaProxy, o.kafkaChaos); err != nil {
			return 2, err
		}
		defer kpx.Close()
		if err := checkAdvertised(kpx.Addr()); err != nil {
			return 2, fmt.Errorf("kafka proxy %s → %s: %w", kpx.Addr(), o.kafkaChaos, err)
		}
		routerBrokers = kpx.Addr()
		logf("kafka proxy %s → CHAOS listener %s, advertised as %s: routers bootstrap, fetch and produce through it", kpx.Addr(), o.kafkaChaos, kpx.Addr())
	} else {
		if p.kLatencies+p.kResets+p.kCuts > 0 {
			logf("WARNING: no -kafka-chaos-listener (ONCEFLOW_KAFKA_CHAOS_PORT): Kafka network faults are NOT injected")
		}
		p.kLatencies, p.kResets, p.kCuts = 0, 0, 0
	}

	cfgPath := filepath.Join(o.runDir, "chaos.yaml")
	if err := os.WriteFile(cfgPath, []byte(chaosConfig(info.Prefix, o.seed)), 0o644); err != nil {
		return 2, err
	}
	adminDSN := dsn("onceflow_admin:onceflow_admin", o.dbAddr, o.dbName)
	appDSN := dsn("onceflow:onceflow", o.dbAddr, o.dbName)
	baseEnv := append(cleanEnv(), "ONCEFLOW_CONFIG="+cfgPath, "ONCEFLOW_KAFKA_BROKERS="+strings.Join(o.brokers, ","),
		"ONCEFLOW_DB_ADMIN_DSN="+adminDSN)
	migrate := exec.CommandContext(ctx, bin, "migrate", "--reset")
	migrate.Env = append(baseEnv, "ONCEFLOW_DB_DSN="+appDSN)
	if out, err := migrate.CombinedOutput(); err != nil {
		return 2, fmt.Errorf("router migrate --reset (%s): %v\n%s", o.dbName, err, out)
	}
	logf("database %s: fresh schema", o.dbName)

	if info.StartOffsets, err = TopicEnds(o.brokers, orderTopic, grantedTopic); err != nil {
		return 2, fmt.Errorf("kafka: %w", err)
	}
	// The misbehaving plugin's group starts where the run starts: what earlier runs left on
	// order-paid is not this run's, and its fresh database has no rows for it.
	if err := commitOffsets(o.brokers, misbehaverGroup, orderTopic, info.StartOffsets[orderTopic]); err != nil {
		return 2, fmt.Errorf("kafka: group %s to the run's start offsets (is a router of it running?): %w", misbehaverGroup, err)
	}
	logf("consumer group %s: offsets set to the end of %s", misbehaverGroup, orderTopic)

	routerEnv := append(cleanEnv(), "ONCEFLOW_CONFIG="+cfgPath, "ONCEFLOW_KAFKA_BROKERS="+routerBrokers,
		"ONCEFLOW_DB_ADMIN_DSN="+adminDSN, "ONCEFLOW_DB_DSN="+dsn("onceflow:onceflow", px.Addr(), o.dbName))
	if o.routerEnv != "" {
		routerEnv = append(routerEnv, strings.Split(o.routerEnv, ",")...)
		logf("router environment: %s", o.routerEnv)
	}
	var slots []*slot
	for _, n := range []string{"a", "b", "c"} {
		slots = append(slots, newSlot(n, bin, []string{"run", "--plugins", "coupon-granter," + misbehaverPlugin}, routerEnv, o.runDir, logf))
	}
	closeAll := func() {
		var wg sync.WaitGroup
		for _, s := range slots {
			wg.Add(1)
			go func() { defer wg.Done(); s.close(40 * time.Second) }()
		}
		wg.Wait()
	}
	defer closeAll()
	slots[0].start()
	slots[1].start()
	logf("routers a and b starting (c joins and leaves during the run); logs %s/router-*.log", o.runDir)
	time.Sleep(3 * time.Second)

	// Meanwhile: the producer and the faults.
	var infraMu sync.Mutex // one scripts/infra.sh operation at a time
	var brokerRestarts, dbRestarts, scheduledKills atomic.Int64
	var harnessErrs []string
	var errMu sync.Mutex
	harnessErr := func(format string, args ...any) {
		errMu.Lock()
		harnessErrs = append(harnessErrs, fmt.Sprintf(format, args...))
		errMu.Unlock()
		logf("HARNESS ERROR: "+format, args...)
	}
	infra := func(what string) error {
		out, err := exec.Command("bash", filepath.Join(root, "scripts", "infra.sh"), what).CombinedOutput()
		f, _ := os.OpenFile(filepath.Join(o.runDir, "infra.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if f != nil {
			fmt.Fprintf(f, "== %s %s (err=%v)\n%s", time.Now().Format(time.RFC3339), what, err, out)
			f.Close()
		}
		return err
	}
	restart := func(svc string, down time.Duration, counter *atomic.Int64) {
		infraMu.Lock()
		defer infraMu.Unlock()
		logf("%s: stopping (down for %s)", svc, down.Round(100*time.Millisecond))
		if err := infra(svc + "-stop"); err != nil {
			harnessErr("%s-stop: %v (see infra.log)", svc, err)
		}
		time.Sleep(down)
		for i := 0; ; i++ {
			err := infra(svc + "-start")
			if err == nil {
				break
			}
			if i == 2 {
				harnessErr("%s-start failed 3 times: %v (see infra.log)", svc, err)
				return
			}
			time.Sleep(2 * time.Second)
		}
		counter.Add(1)
		logf("%s: back up", svc)
		if svc == "kafka" {
			if got := brokerOrigin(o.brokers[0]); got != "" && got != wantProps {
				harnessErr("after the restart the broker runs from %s, not %s", got, wantProps)
			}
		}
	}

	rng := rand.New(rand.NewPCG(o.seed, 0xc4a05))
	events := schedule(p, rng)
	writeSchedule(filepath.Join(o.runDir, "schedule.txt"), events)
	logf("schedule: %d fault events over %s (schedule.txt)", len(events), p.window)

	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	var fwg sync.WaitGroup
	start := time.Now()
	fwg.Add(1)
	go func() {
		defer fwg.Done()
		for _, e := range events {
			select {
			case <-fctx.Done():
				return
			case <-time.After(time.Until(start.Add(e.at))):
			}
			fwg.Add(1)
			go func() {
				defer fwg.Done()
				switch e.kind {
				case "kill":
					// An armed router (relay-crash fault pending) is spared: killing it would
					// only postpone its crash point.
					victim := slots[e.victim]
					if !victim.running() || victim.isArmed() {
						for _, s := range slots {
							if s.running() && !s.isArmed() {
								victim = s
								break
							}
						}
					}
					if pid, ok := victim.kill(e.dur); ok {
						scheduledKills.Add(1)
						logf("SIGKILL router %s (pid %d), restart in %s", victim.name, pid, e.dur.Round(10*time.Millisecond))
					} else {
						logf("kill: no router running at this moment (skipped)")
					}
				case "join":
					logf("router c joins")
					slots[2].start()
				case "leave":
					logf("router c leaves (SIGTERM)")
					slots[2].stop(40 * time.Second)
				case "db-latency", "kafka-latency", "db-reset", "kafka-reset", "db-cut", "kafka-cut":
					target, what, _ := strings.Cut(e.kind, "-")
					x := px
					if target == "kafka" {
						x = kpx
					}
					netFault(x, target, what, e)
				case "relay-crash":
					// Not while a service restarts (the armed router would only fail to start):
					// it holds the infra lock until the crash happened or 25 s passed.
					infraMu.Lock()
					relayCrash(slots, e, 25*time.Second)
					infraMu.Unlock()
				case "kafka":
					restart("kafka", e.dur, &brokerRestarts)
				case "db":
					restart("db", e.dur, &dbRestarts)
				}
			}()
		}
	}()

	// The producer: segments of orders, each a `router produce` run with its own ledger; a
	// segment that fails (broker restarting) is sent again in full with the same seed: the
	// same orders and payloads, i.e. more duplicate deliveries, which is what a producer
	// retry is.
	perSeg := p.orders / p.segments
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	go func() {
		for seg := 0; seg < p.segments; seg++ {
			prefix := fmt.Sprintf("%s-s%02d", info.Prefix, seg)
			ledger := filepath.Join(o.runDir, fmt.Sprintf("ledger-s%02d.txt", seg))
			deadline := time.Now().Add(3 * time.Minute)
			for attempt := 1; ; attempt++ {
				cmd := exec.CommandContext(ctx, bin, "produce", "--orders", fmt.Sprint(perSeg), "--dup-rate", "0.3",
					"--poison", fmt.Sprint(max(perSeg/100, 2*len(poisonKinds))), "--rate", fmt.Sprint(p.rate), "--prefix", prefix,
					"--seed", fmt.Sprint(o.seed*1000+uint64(seg)), "--ledger", ledger)
				cmd.Env = append(baseEnv, "ONCEFLOW_DB_DSN="+appDSN)
				out, err := cmd.CombinedOutput()
				if err == nil {
					produced.Add(int64(perSeg))
					logf("segment %d/%d: %s", seg+1, p.segments, strings.TrimSpace(lastLine(string(out))))
					break
				}
				if ctx.Err() != nil || time.Now().After(deadline) {
					prodErr <- fmt.Errorf("segment %s: %v: %s", prefix, err, lastLine(string(out)))
					return
				}
				logf("segment %d attempt %d failed (%s): sending it again in 2s", seg+1, attempt, strings.TrimSpace(lastLine(string(out))))
				time.Sleep(2 * time.Second)
			}
			info.Ledgers = append(info.Ledgers, ledger)
		}
		prodErr <- nil
	}()
	if err := <-prodErr; err != nil {
		harnessErr("producer: %v", err)
	}
	logf("producer done: %d orders in %d segments", produced.Load(), len(info.Ledgers))
	fwg.Wait()
	fcancel()
	if ctx.Err() != nil {
		return 2, errors.New("interrupted")
	}

	// Heal: no proxy faults, both services up, routers a and b running, c gone.
	px.Heal()
	if kpx != nil {
		kpx.Heal()
	}
	for _, s := range slots {
		s.disarm()
	}
	infraMu.Lock()
	if err := infra("up"); err != nil {
		harnessErr("infra.sh up after the faults: %v", err)
	}
	infraMu.Unlock()
	slots[2].stop(40 * time.Second)
	slots[0].start()
	slots[1].start()
	kills, unplanned, crashes, armed := 0, 0, 0, 0
	for _, s := range slots {
		s.mu.Lock()
		kills += s.kills
		unplanned += s.unplanned
		crashes += s.crashes
		armed += s.arms
		s.mu.Unlock()
	}
	info.Kills, info.BrokerRestar, info.DBRestarts = kills, int(brokerRestarts.Load()), int(dbRestarts.Load())
	info.Faults = map[string]string{
		"kills":         fmt.Sprintf("%d SIGKILLs: %d from kill faults, the rest from relay-crash faults", kills, scheduledKills.Load()),
		"relay_crashes": fmt.Sprintf("%d of %d relay-crash faults crashed a router right after a Kafka commit", crashes, armed),
		"db_proxy":      px.Stats(),
		"kafka_proxy":   "not proxied",
	}
	if kpx != nil {
		info.Faults["kafka_proxy"] = kpx.Stats()
	}
	logf("faults over: kills=%d broker_restarts=%d db_restarts=%d relay_crashes=%d/%d unplanned_router_exits=%d; healing and draining (≤ %s)",
		kills, info.BrokerRestar, info.DBRestarts, crashes, armed, unplanned, p.drain)
	logf("network faults: db proxy %s; kafka proxy %s", info.Faults["db_proxy"], info.Faults["kafka_proxy"])
	saveInfo(o.runDir, info)

	drainStart := time.Now()
	drained, why := drain(ctx, appDSN, info, p.drain)
	if drained {
		logf("drained: %s", why)
		// Offsets are committed every second: wait (bounded) until every group of the run
		// has committed the end of every partition while the routers still run. The checker
		// reads them again after the routers stopped.
		lags, err := waitLag(ctx, o.brokers, runGroups, info.StartOffsets, max(p.drain-time.Since(drainStart), 30*time.Second))
		if err != nil {
			logf("committed offsets: %v", err)
		} else {
			logf("committed offsets before stopping the routers: %s", lagSummary(lags))
		}
	} else {
		harnessErr("not drained after %s: %s", p.drain, why)
	}
	closeAll()
	logf("routers stopped")

	if sk := int(scheduledKills.Load()); sk < p.minKills {
		harnessErr("only %d kills from kill faults, profile %s wants ≥ %d", sk, p.name, p.minKills)
	}
	if info.BrokerRestar < p.brokerRestarts || info.DBRestarts < p.dbRestarts {
		harnessErr("restarts: broker %d/%d, db %d/%d", info.BrokerRestar, p.brokerRestarts, info.DBRestarts, p.dbRestarts)
	}
	return audit(ctx, o, info, appDSN, adminDSN, kinds, harnessErrs)
}

func audit(ctx context.Context, o options, info runInfo, appDSN, adminDSN string, kinds []string, harnessErrs []string) (int, error) {
	cc := CheckConfig{DSN: appDSN, Brokers: info.Brokers, GrantedTopic: grantedTopic, OrderTopic: orderTopic,
		StartOffsets: info.StartOffsets, Prefix: info.Prefix, Ledgers: info.Ledgers,
		Misbehaver: misbehaverBiz, Groups: runGroups, LagWait: 30 * time.Second}
	rep, err := Check(ctx, cc)
	if err != nil {
		return 2, err
	}
	printReport(rep)
	extra := []string{}
	for _, h := range harnessErrs {
		extra = append(extra, "harness("+strings.ReplaceAll(h, " ", "_")+")")
	}
	for _, k := range poisonKinds {
		if rep.PoisonKinds[k] == 0 {
			extra = append(extra, "harness(no_"+k+"_poison_record_on_"+orderTopic+")")
		}
	}
	if len(kinds) > 0 {
		logf("before injection: %s", summary(rep, info.Kills, info.BrokerRestar, info.DBRestarts, extra))
		admin, err := sql.Open("mysql", adminDSN)
		if err != nil {
			return 2, err
		}
		defer admin.Close()
		done, err := inject(ctx, admin, info.Prefix, kinds, injectTarget{Brokers: info.Brokers, GrantedTopic: grantedTopic,
			OrderTopic: orderTopic, Misbehaver: misbehaverBiz})
		for _, d := range done {
			logf("injected %s", d)
		}
		if err != nil {
			return 2, err
		}
		if rep, err = Check(ctx, cc); err != nil {
			return 2, err
		}
		printReport(rep)
		for _, k := range kinds {
			if rep.Has(injectKinds[k]) {
				logf("injected %s → reported as %s", k, injectKinds[k])
			} else {
				logf("injected %s → NOT REPORTED (checker bug)", k)
				extra = append(extra, "undetected-injection("+k+")")
			}
		}
	}
	fmt.Printf("chaos: runtime %.0fs (run dir %s)\n", time.Since(t0).Seconds(), o.runDir)
	line := summary(rep, info.Kills, info.BrokerRestar, info.DBRestarts, extra)
	fmt.Println(line)
	if strings.HasPrefix(line, "CHAOS ok") {
		return 0, nil
	}
	return 1, nil
}

func checkOnly(ctx context.Context, o options, kinds []string) (int, error) {
	if o.runDir == "" {
		o.runDir = filepath.Join(o.root, ".run", "chaos", "last")
	}
	b, err := os.ReadFile(filepath.Join(o.runDir, "run.json"))
	if err != nil {
		return 2, fmt.Errorf("-check-only: %w", err)
	}
	var info runInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return 2, fmt.Errorf("-check-only: %s/run.json: %w", o.runDir, err)
	}
	logf("auditing run %s (prefix %s, database %s)", o.runDir, info.Prefix, info.DB)
	return audit(ctx, o, info, dsn("onceflow:onceflow", info.DBAddr, info.DB), dsn("onceflow_admin:onceflow_admin", info.DBAddr, info.DB), kinds, nil)
}

func printReport(r Report) {
	var reasons []string
	for k, n := range r.QuarantineReasons {
		reasons = append(reasons, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(reasons)
	logf("checker: orders=%d granted=%d failed=%d quarantined=%d %v lost=%d", r.Orders, r.Granted, r.Failed, r.Quarantined, reasons, r.Lost)
	logf("checker: deliveries=%d (order-paid messages of the run on Kafka; ledgers declare %d, segment re-sends add to it) duplicates_blocked=%d redeliveries≈%d poison=%d quarantined_as_poison=%d",
		r.KafkaDeliveries, r.LedgerDeliveries, r.DuplicatesBlocked, r.Redeliveries(), r.LedgerPoison, r.PoisonQuarantined)
	logf("checker: grant_events=%d (distinct CouponGranted event ids, read_committed) duplicate_events=%d duplicate_coupons=%d transitions=%d",
		r.GrantEvents, r.DupEvents, r.DupCoupons, r.Transitions)
	if len(r.PoisonKinds) > 0 {
		var kinds []string
		for _, k := range poisonKinds {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, r.PoisonKinds[k]))
		}
		logf("checker: poison records of the run on %s: %d (%s); inbox rows quarantined as poison: %s %d, %s %d",
			orderTopic, r.PoisonOnKafka, strings.Join(kinds, " "), "coupon", r.PoisonQuarantined, misbehaverBiz, r.MisbehaverPoison)
	}
	if r.MisbehaverWant != nil {
		logf("checker: %s (biz type %s) outcomes as planned: %s", misbehaverPlugin, misbehaverBiz, misbehaverSummary(r))
	}
	if r.LagChecked {
		logf("checker: committed lag %d: %s", r.LagTotal, lagSummary(r.Lags))
	}
	for _, v := range r.Violations {
		fmt.Printf("VIOLATION %s (%d): %s\n", v.Kind, v.Count, strings.Join(v.Examples, "; "))
	}
}

type event struct {
	at     time.Duration
	kind   string
	victim int
	dur    time.Duration // restart delay (kill), outage (kafka, db, cut), length (latency, reset window)
	val    time.Duration // latency; for relay-crash the crash point's count
}

// schedule draws the run's faults from rng: the same seed gives the same schedule.
func schedule(p profile, rng *rand.Rand) []event {
	warm := 8 * time.Second
	span := p.window - warm - 10*time.Second
	at := func() time.Duration { return warm + time.Duration(rng.Int64N(int64(span))) }
	between := func(a, b time.Duration) time.Duration { return a + time.Duration(rng.Int64N(int64(b-a))) }
	var ev []event
	for range p.kills {
		ev = append(ev, event{at: at(), kind: "kill", victim: rng.IntN(2), dur: between(200*time.Millisecond, 3*time.Second)})
	}
	// Join/leave cycles of router c, in disjoint slices of the window.
	for i := range p.joins {
		slice := span / time.Duration(p.joins)
		j := warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/3)))
		ev = append(ev, event{at: j, kind: "join"}, event{at: j + between(slice/3, slice*2/3), kind: "leave"})
	}
	// Broker and database restarts spread over the window (one infra operation at a time).
	for i := range p.brokerRestarts {
		slice := span / time.Duration(p.brokerRestarts)
		ev = append(ev, event{at: warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/2))), kind: "kafka", dur: between(2*time.Second, 8*time.Second)})
	}
	for i := range p.dbRestarts {
		slice := span / time.Duration(p.dbRestarts)
		ev = append(ev, event{at: warm + slice*time.Duration(i) + slice/2 + time.Duration(rng.Int64N(int64(slice/3))), kind: "db", dur: between(2*time.Second, 6*time.Second)})
	}
	for _, target := range []string{"db", "kafka"} {
		lat, res, cut := p.latencies, p.resets, p.cuts
		if target == "kafka" {
			lat, res, cut = p.kLatencies, p.kResets, p.kCuts
		}
		for range lat {
			ev = append(ev, event{at: at(), kind: target + "-latency", val: between(20*time.Millisecond, 250*time.Millisecond), dur: between(4*time.Second, 10*time.Second)})
		}
		for range res {
			ev = append(ev, event{at: at(), kind: target + "-reset", dur: between(time.Second, 2*time.Second)})
		}
		for range cut {
			ev = append(ev, event{at: at(), kind: target + "-cut", dur: between(2*time.Second, 6*time.Second)})
		}
	}
	for i := range p.relayCrashes {
		// In disjoint slices (a second one would kill the first one's armed router); val
		// carries the crash point's count: the n-th Kafka commit of the armed process.
		slice := span / time.Duration(p.relayCrashes)
		ev = append(ev, event{at: warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/2))), kind: "relay-crash",
			victim: rng.IntN(2), val: time.Duration(1 + rng.IntN(3))})
	}
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].at < ev[j].at })
	return ev
}

func writeSchedule(path string, ev []event) {
	var b strings.Builder
	for _, e := range ev {
		val := e.val.Round(time.Millisecond).String()
		if e.kind == "relay-crash" {
			val = fmt.Sprintf("after-kafka-commit:%d", int(e.val))
		}
		fmt.Fprintf(&b, "%7.1fs %-13s victim=%d dur=%s val=%s\n", e.at.Seconds(), e.kind, e.victim, e.dur.Round(time.Millisecond), val)
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}

// drain waits until every ledger order is terminal or quarantined, has its row done or
// failed in the misbehaving plugin's inbox, no inbox row of the run is processing, and the
// outbox is published (own SQL, direct to MariaDB).
func drain(ctx context.Context, appDSN string, info runInfo, bound time.Duration) (bool, string) {
	total := 0
	for _, l := range info.Ledgers {
		lf, err := readLedger(l)
		if err != nil {
			return false, err.Error()
		}
		total += len(lf.orders)
	}
	db, err := sql.Open("mysql", appDSN)
	if err != nil {
		return false, err.Error()
	}
	defer db.Close()
	like := likePrefix(info.Prefix)
	deadline := time.Now().Add(bound)
	why := ""
	for {
		var terminal, quarantined, processing, pending, misbehaved int
		err := db.QueryRowContext(ctx, `SELECT
 (SELECT COUNT(*) FROM coupon_grant WHERE order_id LIKE ? AND state IN ('GRANTED', 'FAILED')),
 (SELECT COUNT(*) FROM inbox WHERE biz_type = 'coupon' AND dedup_key LIKE ? AND status = 'failed' AND dedup_key NOT LIKE '%#conflict:%'),
 (SELECT COUNT(*) FROM inbox WHERE biz_type IN ('coupon', ?) AND dedup_key LIKE ? AND status = 'processing'),
 (SELECT COUNT(*) FROM outbox WHERE published_at IS NULL),
 (SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND dedup_key LIKE ? AND status IN ('done', 'failed') AND dedup_key NOT LIKE '%#conflict:%')`,
			like, like, misbehaverBiz, like, misbehaverBiz, like).Scan(&terminal, &quarantined, &processing, &pending, &misbehaved)
		if err == nil {
			why = fmt.Sprintf("%d/%d orders terminal, %d quarantined, %d/%d ended in %s's inbox, %d processing, %d outbox rows unpublished",
				terminal, total, quarantined, misbehaved, total, misbehaverPlugin, processing, pending)
			if terminal+quarantined >= total && misbehaved >= total && processing == 0 && pending == 0 {
				return true, why
			}
		} else {
			why = err.Error()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, why
		}
		time.Sleep(time.Second)
	}
}

func saveInfo(dir string, info runInfo) {
	b, _ := json.MarshalIndent(info, "", "  ")
	_ = os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644)
}

func chaosConfig(prefix string, seed uint64) string {
	return fmt.Sprintf(`# Generated by cmd/chaos for run %s.
kafka:
  session_timeout: 6s
  rebalance_timeout: 10s
  heartbeat: 1s
inbox:
  backoff_initial: 20ms
  backoff_max: 1s
  handler_timeout: %s   # the misbehaving plugin's blocked calls are abandoned after this
  max_payload_bytes: %d   # a value 1 KiB over it still fits Kafka's max message size: the oversized poison kind is sent
relay:
  # A transactional id of its own: the positions topic is shared with every other database,
  # and a fresh database must not reconcile against another run's last batch.
  transactional_id: onceflow-relay-%s
  lease_ttl: %s
  txn_timeout: 15s
  retry_backoff: 200ms
  max_retry_backoff: 2s
  lag_bound: 10m
admin:
  listen: ""
log:
  level: info
plugins:
  coupon-granter:
    step_delay: 1ms
    step_jitter: 4ms
    step_failure_rate: 0.1   # 10 %% of the external calls of every step fail (retried by the inbox)
    seed: %d
`, prefix, handlerTimeout, maxPayloadBytes, prefix, leaseTTL, seed)
}

// cleanEnv is the harness's environment without ONCEFLOW_* settings (the run sets its own).
func cleanEnv() []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "ONCEFLOW_") {
			out = append(out, e)
		}
	}
	return out
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// groupMembers is the number of members of the coupon plugin's consumer group right now.
func groupMembers(brokers []string) int {
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		return 0
	}
	defer admin.Close()
	gs, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(gs) == 0 {
		return 0
	}
	return len(gs[0].Members)
}

// brokerOrigin is the server.properties of the kafka.Kafka process listening on addr's port,
// "" when it cannot be told.
func brokerOrigin(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	out, err := exec.Command("ss", "-ltnpH", "sport = :"+port).Output()
	if err != nil {
		return ""
	}
	for _, m := range regexp.MustCompile(`pid=(\d+)`).FindAllStringSubmatch(string(out), -1) {
		cmdline, err := os.ReadFile("/proc/" + m[1] + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		isKafka := false
		props := ""
		for _, a := range args {
			if a == "kafka.Kafka" {
				isKafka = true
			}
			if strings.HasSuffix(a, ".properties") {
				props = a
			}
		}
		if isKafka && props != "" {
			return props
		}
	}
	return ""
}

// isDefaultInstance reports whether addr is on the default instance's port.
func isDefaultInstance(addr, port string) bool {
	_, p, err := net.SplitHostPort(addr)
	return err == nil && p == port
}

// checkAdvertised asks the broker through the proxy for its metadata and requires every
// broker to be advertised at the proxy's own address: otherwise a client bootstrapped
// through the proxy would talk to the broker directly and no fault would reach it.
func checkAdvertised(proxyAddr string) error {
	client, err := sarama.NewClient([]string{proxyAddr}, saramaConfig())
	if err != nil {
		return fmt.Errorf("metadata through the proxy: %w", err)
	}
	defer client.Close()
	for _, b := range client.Brokers() {
		if b.Addr() != proxyAddr {
			return fmt.Errorf("broker %d is advertised at %s, not at the proxy %s (is the CHAOS listener advertised on the proxy's port? scripts/infra.sh ONCEFLOW_KAFKA_CHAOS_ADVERTISED_PORT)", b.ID(), b.Addr(), proxyAddr)
		}
	}
	if len(client.Brokers()) == 0 {
		return errors.New("no broker in the metadata")
	}
	return nil
}

// netFault runs one network fault on x (the db or kafka proxy) and logs it.
func netFault(x *proxy, target, what string, e event) {
	if x == nil {
		return
	}
	var err error
	switch what {
	case "latency":
		logf("%s proxy: +%s latency per chunk each way for %s", target, e.val.Round(time.Millisecond), e.dur.Round(100*time.Millisecond))
		if err = x.SetLatency(e.val); err == nil {
			time.Sleep(e.dur)
			err = x.SetLatency(0)
		}
	case "reset":
		logf("%s proxy: resetting every connection that carries data in the next %s", target, e.dur.Round(100*time.Millisecond))
		err = x.Reset(e.dur)
	case "cut":
		logf("%s proxy: cut (all traffic dropped) for %s", target, e.dur.Round(100*time.Millisecond))
		if err = x.SetCut(true); err == nil {
			time.Sleep(e.dur)
			err = x.SetCut(false)
			logf("%s proxy: cut healed (connections that lived through it closed)", target)
		}
	}
	if err != nil {
		logf("%s proxy: %s: %v", target, what, err)
	}
}

// relayCrash makes the relay crash between a Kafka commit and the database mark, the moment
// its reconciliation exists for: the victim router restarts at once armed with
// ONCEFLOW_RELAY_CRASH_POINT=after-kafka-commit:n (it exits with 137 right after its n-th
// Kafka commit, before marking the rows; its restarts stay armed until one does), every
// other router is SIGKILLed too and kept down until the dead owner's lease has expired, so
// the victim is the one that takes the lease.
// The next relay session (any router) must reconcile that batch rather than publish it again.
// It waits up to wait for the crash.
func relayCrash(slots []*slot, e event, wait time.Duration) {
	victim := slots[e.victim]
	n := int(e.val)
	victim.arm(fmt.Sprintf("ONCEFLOW_RELAY_CRASH_POINT=after-kafka-commit:%d", n))
	others := leaseTTL + 1500*time.Millisecond
	var killed []string
	for _, s := range slots {
		delay := others
		if s == victim {
			delay = 300 * time.Millisecond
		} else {
			s.delayStart(time.Now().Add(others))
		}
		if pid, ok := s.kill(delay); ok {
			killed = append(killed, fmt.Sprintf("%s (pid %d)", s.name, pid))
		}
	}
	logf("relay crash: SIGKILL %s; router %s restarts armed to crash right after its Kafka commit #%d (before the mark), the others in %s",
		strings.Join(killed, ", "), victim.name, n, others)
	crashes := func() int { victim.mu.Lock(); defer victim.mu.Unlock(); return victim.crashes }
	before := crashes()
	deadline := time.Now().Add(wait)
	for crashes() == before {
		if time.Now().After(deadline) {
			logf("relay crash: router %s did not reach its crash point within %s (its starts stay armed until one does)", victim.name, wait)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

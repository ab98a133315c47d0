// Command chaos runs `router run` processes against a real MariaDB (or, with -dialect
// postgres, PostgreSQL) and Kafka while `router produce` sends orders with duplicate
// deliveries and poison, and meanwhile kills routers with SIGKILL, crashes the relay between
// its Kafka commit and its database mark, makes consumers join and leave, restarts the
// broker and the database (scripts/infra.sh), and injects latency, connection resets and a
// cut between the routers and the database and between the routers and Kafka through
// in-process toxiproxies (proxy.go: plain TCP, whatever the wire protocol). After healing and
// draining, an independent checker (checker.go) audits the producer's ledger, the database,
// coupon-granted and the consumer groups' committed offsets, and the run ends with one line:
// `CHAOS ok ...` or `CHAOS FAIL ...`.
//
// Beside the coupon granter every router runs chaos-misbehaver, a test plugin only the
// chaos build of the router has (tools/chaosrouter/chaosplugin.go): it consumes the same
// orders in its own group and biz type and panics resp. blocks for ever on the orders
// internal/chaosplan picks; the checker predicts which and checks they ended quarantined with
// reason panic resp. timeout, and the rest done.
//
// It restarts the services it runs against: scripts/chaos.sh points it at a second instance
// of scripts/infra.sh (INFRA_RUN_DIR, INFRA_DB_PORT, INFRA_PG_PORT, INFRA_KAFKA_PORT,
// ...), and it refuses to restart the default instance (3306 / 5432 / 9092) unless -allow-shared.
//
//	scripts/chaos.sh                                   # or make chaos; CHAOS_PROFILE=long
//	.run/chaos/chaos -check-only -run-dir .run/chaos/<run> -inject all   # the checker must FAIL
//
// Every fault time, victim and duration comes from -seed (the order-id prefix also carries
// the start time, so runs never share ids on the shared topics).
//
// The steps of a run are methods of harness (harness.go): setup.go prepares the router
// binary, checks the services, starts the proxies and migrates a fresh database; fleet.go
// supervises the routers; faults.go plays the schedule (schedule.go) while the producer
// sends; drain.go heals and waits for the routers to finish; report.go audits the run and
// prints the CHAOS line.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/pkg/dbx"
)

type options struct {
	profile, root, router, runDir, dbName, dbAddr, inject string
	speedSingle                                           string      // galera profile: the single node of the speed comparison
	dialect                                               dbx.Dialect // the database: MariaDB or PostgreSQL
	kafkaProxy, kafkaChaos                                string
	routerEnv                                             string
	brokers                                               []string
	seed                                                  uint64
	soakOrders                                            int
	soakWindow                                            time.Duration
	checkOnly, allowShared                                bool
}

// runInfo is saved next to the run's logs so that `-check-only -run-dir` can audit it again.
type runInfo struct {
	Prefix       string                     `json:"prefix"`
	Seed         uint64                     `json:"seed"`
	Profile      string                     `json:"profile"`
	DB           string                     `json:"db"`
	Dialect      dbx.Dialect                `json:"dialect,omitempty"` // empty: mariadb
	DBAddr       string                     `json:"db_addr"`
	Brokers      []string                   `json:"brokers"`
	Ledgers      []string                   `json:"ledgers"`
	StartOffsets map[string]map[int32]int64 `json:"start_offsets"`
	Kills        int                        `json:"kills"`
	BrokerRestar int                        `json:"broker_restarts"`
	DBRestarts   int                        `json:"db_restarts"`
	Faults       map[string]string          `json:"faults,omitempty"`        // what was injected, by kind
	Cluster      *clusterCounts             `json:"cluster,omitempty"`       // the cluster faults (cluster, soak)
	NoMisbehaver bool                       `json:"no_misbehaver,omitempty"` // only the coupon granter ran
	DBNodeKills  int                        `json:"db_node_kills,omitempty"` // Galera nodes SIGKILLed
	SpeedGalera  float64                    `json:"orders_per_s_galera,omitempty"`
	SpeedSingle  float64                    `json:"orders_per_s_single,omitempty"`
	Started      time.Time                  `json:"started"`
}

const (
	orderTopic   = "order-paid"
	grantedTopic = "coupon-granted"
	group        = "coupon-sender"
	// The misbehaving plugin (tools/chaosrouter/chaosplugin.go), in the chaos build of the
	// router (routerPkg, a package of the tools module).
	routerPkg        = "./chaosrouter"
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
var poisonKinds = []string{"bad-json", "tombstone", "empty", "utf8-value", "utf8-key", "utf8-headers", "utf8-string", "big-headers", "oversized"}

// runGroups are the consumer groups of the run's routers and what they consume.
var runGroups = []GroupTopic{{group, orderTopic}, {misbehaverGroup, orderTopic}}

// groupsOf is runGroups, without the misbehaving plugin's when it did not run.
func groupsOf(info runInfo) []GroupTopic {
	if info.NoMisbehaver {
		return runGroups[:1]
	}
	return runGroups
}

func main() {
	c := clock{t0: time.Now()}
	var o options
	var brokers string
	prof := os.Getenv("CHAOS_PROFILE")
	if prof == "" {
		prof = "short"
	}
	flag.StringVar(&o.profile, "profile", prof, "short (~3 min), long (~12 min), cluster (~7 min, on the three-broker cluster) or soak (-soak-window); env CHAOS_PROFILE")
	flag.Uint64Var(&o.seed, "seed", envUint("CHAOS_SEED", 1), "seed of every fault time, victim and duration; env CHAOS_SEED")
	flag.StringVar(&o.root, "root", ".", "repository root (scripts/infra.sh)")
	flag.StringVar(&o.router, "router", ".run/chaos/router", "router binary, built from tools/"+routerPkg[2:]+" (copied into the run directory at start; built if missing)")
	flag.StringVar(&o.runDir, "run-dir", "", "run directory (default .run/chaos/<prefix>); with -check-only: the run to audit")
	flag.StringVar(&o.dbName, "db", "onceflow_chaos", "database of the run (dropped and migrated at start)")
	dialect := flag.String("dialect", "mariadb", "the database of the run: mariadb or postgres (scripts/chaos.sh: DB=postgres)")
	flag.StringVar(&o.dbAddr, "db-addr", "", "database address (default from INFRA_DB_PORT for MariaDB, INFRA_PG_PORT for PostgreSQL, as scripts/infra.sh)")
	flag.StringVar(&brokers, "brokers", "127.0.0.1:"+envOr("INFRA_KAFKA_PORT", "9092"), "Kafka brokers, direct (default from INFRA_KAFKA_PORT)")
	kchaos, kadv := os.Getenv("INFRA_KAFKA_CHAOS_PORT"), os.Getenv("INFRA_KAFKA_CHAOS_ADVERTISED_PORT")
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
	flag.StringVar(&o.kafkaChaos, "kafka-chaos-listener", kchaos, "the broker's CHAOS listener (default from INFRA_KAFKA_CHAOS_PORT); empty: Kafka is not proxied")
	flag.StringVar(&o.kafkaProxy, "kafka-proxy", kadv, "where the Kafka proxy listens = the CHAOS listener's advertised address (default from INFRA_KAFKA_CHAOS_ADVERTISED_PORT, else CHAOS port + 1)")
	flag.StringVar(&o.speedSingle, "speed-single", "", "galera profile: the single MariaDB node whose orders/s the cluster's are compared with (default from INFRA_DB_PORT)")
	flag.StringVar(&o.routerEnv, "router-env", "", "extra environment of the router processes, comma separated KEY=VALUE (e.g. ONCEFLOW_INBOX_BATCH_SIZE=1)")
	flag.BoolVar(&o.allowShared, "allow-shared", false, "allow restarting the default scripts/infra.sh instance (127.0.0.1:3306 / :9092), which other tests may be using")
	flag.StringVar(&o.inject, "inject", "", "after the run, inject faults into what it left (dup-coupon,lost-order,illegal-transition,dup-event or all): the checker must FAIL")
	flag.BoolVar(&o.checkOnly, "check-only", false, "do not run: audit -run-dir (the last run by default) again")
	flag.IntVar(&o.soakOrders, "soak-orders", int(envUint("CHAOS_SOAK_ORDERS", 1000000)), "orders of the soak profile; env CHAOS_SOAK_ORDERS")
	flag.DurationVar(&o.soakWindow, "soak-window", time.Duration(envUint("CHAOS_SOAK_MINUTES", 30))*time.Minute, "how long the soak profile sends and injects faults; env CHAOS_SOAK_MINUTES (minutes)")
	flag.Parse()
	o.brokers = strings.Split(brokers, ",")
	var err error
	if o.dialect, err = parseDialect(*dialect); err != nil {
		fmt.Printf("CHAOS FAIL harness: %v\n", err)
		os.Exit(2)
	}
	if o.speedSingle == "" {
		o.speedSingle = "127.0.0.1:" + envOr("INFRA_DB_PORT", "3306")
	}
	if o.dbAddr == "" {
		o.dbAddr = "127.0.0.1:" + envOr("INFRA_DB_PORT", "3306")
		if o.dialect.IsPostgres() {
			o.dbAddr = "127.0.0.1:" + envOr("INFRA_PG_PORT", "5432")
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, c, o)
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

// run is one run of the harness, step by step (or, with -check-only, the audit of an
// earlier one): its exit code is 0 for CHAOS ok, 1 for CHAOS FAIL; an error is the
// harness's own failure (exit 2).
func run(ctx context.Context, c clock, o options) (int, error) {
	kinds, err := parseInject(o.inject)
	if err != nil {
		return 2, err
	}
	if o.checkOnly {
		return checkOnly(ctx, c, o, kinds)
	}
	p, ok := profiles[o.profile]
	if o.profile == "soak" {
		p, ok = soakProfile(o.soakOrders, o.soakWindow), true
	}
	if !ok {
		return 2, fmt.Errorf("-profile %q: use short, long, cluster, galera or soak", o.profile)
	}
	h, err := newHarness(c, o, p, kinds)
	if err != nil {
		return 2, err
	}
	if err := h.prepareRouter(); err != nil {
		return 2, err
	}
	if err := h.checkServices(); err != nil {
		return 2, err
	}
	defer h.closeProxies()
	if err := h.startProxies(); err != nil {
		return 2, err
	}
	if p.galera {
		// Fault-free, the single node first, then the cluster: orders/s on each.
		if h.info.SpeedSingle, err = h.speed(ctx, "single", h.o.speedSingle); err != nil {
			return 2, err
		}
		if h.info.SpeedGalera, err = h.speed(ctx, "galera", h.o.dbAddr); err != nil {
			return 2, err
		}
	}
	if err := h.freshState(ctx); err != nil {
		return 2, err
	}
	defer h.closeFleet()
	h.startFleet()
	if err := h.injectFaults(ctx); err != nil {
		return 2, err
	}
	h.heal()
	h.recordFaults()
	h.settle(ctx)
	h.checkFaultCounts()
	return audit(ctx, c, h.o, h.info, h.appDSN, h.adminDSN, kinds, h.errs)
}

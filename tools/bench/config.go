package main

import (
	"flag"
	"fmt"
	"github.com/onceflow/onceflow/outbox"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/onceflow/onceflow/internal/gcx"
)

// config is the bench's command line, parsed once; nothing changes it afterwards.
type config struct {
	// The database measurements (single, storm, naive).
	orders, workers int
	httpN           int
	httpClients     int
	peerN, peerRate int
	dupPct          float64 // per cent of the orders delivered twice (peer group, router peak run)
	stormN, stormK  int

	// Group commit (batch.go, plain.go, storm and the e2e batch runs).
	batchSize, batchLanes, batchOrders, batchRounds, batchSenders int
	batchLinger                                                   time.Duration

	// The plain handler (plain.go).
	plainRounds, plainSingle int
	plainModes               string

	// The relays (relay.go, forwarder.go).
	relayN, relayBatch, relayShards, forwarderN int
	rowsOrders                                  int

	// The Kafka client alone (kclient.go).
	kclientN, kclientRounds int

	// End to end (e2e.go, latency.go).
	e2eN, e2eBatchN, e2eSPT, e2eShards, e2eParts int
	e2eLinger                                    time.Duration
	loads, batchLoads                            string
	e2eCoupon                                    string
	loadSecs, warmSecs, rounds                   int
	latencyDump                                  string

	// Tracing off against on (trace.go).
	traceOrders, traceRounds int

	// The incident's own load (seedload.go).
	seedOrders, seedInFlight, seedWindow int
	seedBudget                           int64
	seedModes                            string
	seedDupRate, seedScale               float64
	seedDelay, seedJitter, seedNaiveFor  time.Duration
	seedConsumerScale                    float64
	seedConsumerInterval                 time.Duration

	// The router binary as a child process (router.go).
	routerN, routerRate, routerSecs    int
	leanBatch, leanKills               int
	leanChild                          string // the lean group's child process: in,out,group
	leanProfile                        string
	leanGap                            time.Duration
	routerBig, routerBigBytes          int
	routerStall                        time.Duration
	routerPayloads, routerPayloadBytes int
	routerPayloadStall                 time.Duration
	routerBin, routerEnv               string
	routerProfile                      string
	routerMemProfile                   string
	routerProfileSecs                  int

	// The router binary idle (idle.go), and the short run of the targets (-targets).
	idleSecs int
	targets  bool

	// The services, the output, the process.
	adminDSN, appDSN, brokers, outDir string
	// The same measurements on PostgreSQL (databases.go).
	pgAdminDSN, pgDSN      string
	dbRounds, dbE2EOrders  int
	gogc                   int
	cpuProfile, memProfile string
	only                   string
}

// parseConfig parses the command line (args without the program name) as the flag
// package's default set would: -h prints the usage, a bad flag exits with status 2.
func parseConfig(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.IntVar(&c.orders, "orders", 5000, "orders per database measurement")
	fs.IntVar(&c.workers, "workers", 16, "concurrent workers (database measurements)")
	fs.IntVar(&c.e2eN, "e2e-orders", 5000, "orders for the end-to-end throughput run")
	fs.IntVar(&c.relayN, "relay-events", 250000, "outbox rows for the relay measurement (25 batches of the relay's relay.batch_size)")
	fs.IntVar(&c.rowsOrders, "rows-orders", 30000, "orders of each rows run (the coupon plugin's rows per order, one table at a time)")
	fs.IntVar(&c.stormN, "storm-orders", 10000, "orders in the duplicate storm")
	fs.IntVar(&c.relayBatch, "relay-batch", outbox.RelayConfig{}.WithDefaults().BatchSize, "relay batch size (events per Kafka transaction; the relay's relay.batch_size by default)")
	fs.IntVar(&c.relayShards, "relay-shards", 4, "outbox shards of the sharded exactly-once relay measurement (<2 skips it)")
	fs.IntVar(&c.stormK, "storm-deliveries", 50, "deliveries of each order in the storm")
	fs.IntVar(&c.e2eSPT, "e2e-steps-per-tx", 1, "inbox.steps_per_transaction of the end-to-end runs")
	fs.StringVar(&c.loads, "loads", "100,200", "offered loads (orders/s) for the latency runs, one at a time")
	fs.StringVar(&c.batchLoads, "batch-loads", "500,1000,2000", "offered loads (orders/s) for the latency runs, group commit")
	fs.IntVar(&c.e2eShards, "e2e-relay-shards", 1, "relay.shards of the end-to-end runs")
	fs.IntVar(&c.e2eParts, "e2e-partitions", 12, "partitions of the end-to-end runs' order-paid and coupon-granted topics (scripts/infra.sh creates 12)")
	fs.DurationVar(&c.e2eLinger, "e2e-relay-linger", 5*time.Millisecond, "relay.linger of the end-to-end runs (configs/router.yaml's)")
	fs.IntVar(&c.e2eBatchN, "e2e-batch-orders", 50000, "orders for the end-to-end throughput run, group commit")
	fs.StringVar(&c.e2eCoupon, "e2e-coupon", "batch", "the coupon plugin's paths the group-commit e2e rounds run, back to back in each round: batch (its HandleBatch, the router's), plain (only the contract a plugin author writes), or both: batch,plain")
	fs.IntVar(&c.loadSecs, "load-seconds", 8, "seconds per latency run")
	fs.IntVar(&c.rounds, "rounds", 5, "rounds of the e2e group-commit measurements; their medians are reported (the machine is noisy)")
	fs.IntVar(&c.warmSecs, "warmup-seconds", 2, "seconds each latency run's load runs before it is measured")
	fs.StringVar(&c.adminDSN, "admin-dsn", "onceflow_admin:onceflow_admin@tcp(127.0.0.1:3306)/onceflow_bench", "privileged DSN of the bench database")
	fs.StringVar(&c.appDSN, "dsn", "onceflow:onceflow@tcp(127.0.0.1:3306)/onceflow_bench", "application DSN of the bench database")
	fs.StringVar(&c.pgAdminDSN, "pg-admin-dsn", "postgres://onceflow_admin:onceflow_admin@127.0.0.1:5432/onceflow_bench", "privileged DSN of the PostgreSQL bench database (the databases group)")
	fs.StringVar(&c.pgDSN, "pg-dsn", "postgres://onceflow:onceflow@127.0.0.1:5432/onceflow_bench", "application DSN of the PostgreSQL bench database")
	fs.IntVar(&c.dbRounds, "db-rounds", 3, "rounds of the databases group (MariaDB and PostgreSQL back to back, alternating which goes first); medians reported")
	fs.IntVar(&c.dbE2EOrders, "db-e2e-orders", 30000, "orders of each end-to-end run of the databases group")
	fs.StringVar(&c.brokers, "brokers", "127.0.0.1:9092", "Kafka brokers")
	fs.StringVar(&c.outDir, "out", "tools/bench/results", "where the CSV goes")
	fs.IntVar(&c.gogc, "gogc", gcx.DefaultPercent, "Go GC target of the bench process (the router's runtime.gogc default; GOGC in the environment wins)")
	fs.StringVar(&c.latencyDump, "latency-dump", "", "write every measured order's stage latencies to FILE-<offered rate>.csv (diagnosis of the tail; also times when each order reached the handler, at some CPU cost, and when it was due as Unix ms, to line orders up with other logs)")

	fs.IntVar(&c.batchSize, "batch-size", 512, "inbox.batch_size of the group-commit measurements")
	fs.IntVar(&c.batchLanes, "batch-workers", 2, "inbox.batch_workers of the group-commit measurements")
	fs.DurationVar(&c.batchLinger, "batch-linger", 0, "inbox.batch_linger of the group-commit measurements (0: the default, 2ms)")
	fs.IntVar(&c.batchOrders, "batch-orders", 15000, "orders per group-commit database measurement")
	fs.IntVar(&c.batchRounds, "batch-rounds", 15, "rounds of the group-commit measurements (baseline and inbox back to back, alternating which goes first); medians reported, and the overhead also pooled over all rounds")
	fs.IntVar(&c.batchSenders, "batch-senders", 2048, "concurrent deliveries offered to the Batcher (a router's in-flight messages)")

	fs.IntVar(&c.plainRounds, "plain-rounds", 5, "rounds of the plain-handler measurements (-plain-modes, in alternating order); medians reported")
	fs.StringVar(&c.plainModes, "plain-modes", "savepoint_cost,single,grouped,grouped_inserter,coupon_batch,coupon_plain", "measurements of the plain group (comma separated)")
	fs.IntVar(&c.plainSingle, "plain-single-orders", 3000, "orders of each one-delivery-per-transaction plain measurement (16 workers, -workers)")

	fs.IntVar(&c.kclientN, "kclient-records", 200000, "records each client consumes and produces (in transactions of -relay-batch) in the kclient group")
	fs.IntVar(&c.kclientRounds, "kclient-rounds", 5, "rounds of the kclient group (Sarama, kgo and the router's consuming path back to back, alternating the order); medians reported")
	fs.IntVar(&c.forwarderN, "forwarder-events", 20000, "events for the Watermill forwarder comparison (0 skips it)")

	fs.IntVar(&c.traceOrders, "trace-orders", 20000, "orders of each end-to-end run of the tracing measurement")
	fs.IntVar(&c.traceRounds, "trace-rounds", 3, "rounds of the tracing measurement, each one run off, on and on with unsampled traces; medians reported")

	fs.IntVar(&c.seedOrders, "seed-orders", 20000, "orders of the seed_load run")
	fs.IntVar(&c.httpN, "http-requests", 20000, "requests of the http_claims run (30 % with an earlier request's Idempotency-Key)")
	fs.IntVar(&c.peerN, "peer-orders", 50000, "orders of the peer comparison (a plain Watermill pipeline and onceflow on the same input, -dup-pct delivered twice; 0 skips it)")
	fs.Float64Var(&c.dupPct, "dup-pct", 30, "per cent of the orders delivered twice, a few hundred records after the first, in the peer group and the router group's peak run (0 measures the router without copies)")
	fs.IntVar(&c.peerRate, "peer-rate", 800, "offered load (orders/s) of the peer comparison's latency phase, -load-seconds long: below what the peer sustains")
	fs.IntVar(&c.httpClients, "http-clients", 64, "concurrent clients of the http_claims run, each sending its next request once answered")
	fs.Float64Var(&c.seedDupRate, "seed-dup-rate", 0.3, "duplicate deliveries of the seed_load run")
	fs.DurationVar(&c.seedDelay, "seed-delay", 800*time.Millisecond, "each outside call's base time (seed: 800ms), before -seed-scale")
	fs.DurationVar(&c.seedJitter, "seed-jitter", 1200*time.Millisecond, "each outside call's added random time (seed: up to 1.2s more), before -seed-scale")
	fs.Float64Var(&c.seedScale, "seed-scale", 1, "factor on call times (and on the seed consumer's poll interval); 1 is the incident's")
	fs.IntVar(&c.seedInFlight, "seed-in-flight", 0, "inbox.max_in_flight_calls of the seed_load run (0: the router's default)")
	fs.IntVar(&c.seedWindow, "seed-window", 0, "kafka.window of the seed_load run (0: the router's default)")
	fs.StringVar(&c.seedModes, "seed-modes", "batch,single", "seed_load modes to run (comma separated: batch, single)")
	fs.Int64Var(&c.seedBudget, "seed-budget", 0, "kafka.max_in_flight_bytes of the seed_load run (0: the router's default)")
	fs.DurationVar(&c.seedNaiveFor, "seed-consumer-seconds", 30*time.Second, "how long the seed's own consumer runs beside it")
	fs.Float64Var(&c.seedConsumerScale, "seed-consumer-scale", 0.01, "factor on the seed consumer's call times and poll interval (it is too slow to measure unscaled)")
	fs.DurationVar(&c.seedConsumerInterval, "seed-poll-interval", 5*time.Minute, "the seed consumer's max.poll.interval.ms, before -seed-consumer-scale")

	fs.IntVar(&c.routerN, "router-orders", 50000, "orders pre-loaded for the router binary's peak run (-dup-pct delivered twice; 0 skips it)")
	fs.IntVar(&c.routerRate, "router-rate", 2000, "offered load (orders/s) of the router binary's paced run (0 skips it)")
	fs.IntVar(&c.routerSecs, "router-seconds", 20, "measured seconds of the router binary's paced run (after -warmup-seconds)")
	fs.IntVar(&c.routerBig, "router-big", 600, "records over inbox.max_payload_bytes sent to the router binary's stalled run while its database is stalled (0 skips it)")
	fs.IntVar(&c.routerBigBytes, "router-big-bytes", 1536000, "size of each of them")
	fs.DurationVar(&c.routerStall, "router-stall", 25*time.Second, "how long the stalled run holds the inbox's index range locked")
	fs.IntVar(&c.routerPayloads, "router-payloads", 500, "orders of -router-payload-bytes each (under inbox.max_payload_bytes, so they wait whole) sent to the router binary's stalled run while its database is stalled (0 skips it)")
	fs.IntVar(&c.routerPayloadBytes, "router-payload-bytes", 1_000_000, "size of each of them")
	fs.DurationVar(&c.routerPayloadStall, "router-payload-stall", 80*time.Second, "how long the stalled run holds the inbox's index range locked while those orders wait")
	fs.IntVar(&c.leanBatch, "lean-batch", 2000, "most records of one poll of the lean group's pipeline (one database and one Kafka transaction each)")
	fs.IntVar(&c.leanKills, "lean-kills", 0, "SIGKILL the lean group's pipeline this many times while it works, starting it again each time, then check every order was granted and its event seen once (its CPU then counts the last process only)")
	fs.DurationVar(&c.leanGap, "lean-gap", 0, "with -lean-child: wait this long between each poll's database commit and its Kafka transaction")
	fs.StringVar(&c.leanProfile, "lean-cpuprofile", "", "write a CPU profile of the lean group's (last) pipeline process to this file, from its start until it is stopped")
	fs.StringVar(&c.leanChild, "lean-child", "", "run as the lean group's pipeline on topics in,out in consumer group group (the lean group starts it)")
	fs.StringVar(&c.routerBin, "router-bin", "bin/router", "the router binary measured by the router group (make build)")
	fs.StringVar(&c.routerEnv, "router-env", "", "extra environment of the measured router, comma separated (e.g. GOGC=100,GOMEMLIMIT=120MiB)")
	fs.StringVar(&c.routerProfile, "router-cpuprofile", "", "write a CPU profile of the router binary during its peak run to this file (admin.pprof, -router-cpuprofile-seconds from its first output)")
	fs.StringVar(&c.routerMemProfile, "router-memprofile", "", "write the router binary's allocation profile (/debug/pprof/allocs, whole process) to this file once its peak run has granted every order, before it stops")
	fs.IntVar(&c.routerProfileSecs, "router-cpuprofile-seconds", 3, "how long -router-cpuprofile profiles (the peak run must last longer: raise -router-orders)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.StringVar(&c.memProfile, "memprofile", "", "write an allocation profile of the whole run to this file (go tool pprof -sample_index=alloc_space)")
	fs.IntVar(&c.idleSecs, "idle-seconds", 30, "seconds the idle group measures the router binary idle on an empty topic, and the services before it starts (0 skips it)")
	fs.BoolVar(&c.targets, "targets", false, "run only the groups the targets line needs (-only "+targetsGroups+", unless -only is given), with shorter runs where a target does not need the full sizes (flags given on the command line win), and print the targets of the hot path alone")
	fs.StringVar(&c.only, "only", "", "run only these measurement groups (comma separated: batch, plain, single, storm, relay, relay_db, rows, kclient, e2e, tracing, seed, http, peer, router, lean, idle, scaleout, databases, targets); empty runs all")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.targets {
		c.targetsSizes(fs)
	}
	if c.rounds < 1 || c.batchRounds < 1 || c.traceRounds < 1 || c.traceOrders < 1 {
		return nil, fmt.Errorf("-rounds %d, -batch-rounds %d, -trace-rounds %d, -trace-orders %d: want at least 1", c.rounds, c.batchRounds, c.traceRounds, c.traceOrders)
	}
	if c.kclientN < 1 || c.kclientRounds < 1 || c.relayBatch < 1 {
		return nil, fmt.Errorf("-kclient-records %d, -kclient-rounds %d, -relay-batch %d: want at least 1", c.kclientN, c.kclientRounds, c.relayBatch)
	}
	if vs := splitList(c.e2eCoupon); len(vs) == 0 || len(vs) > 2 || slices.ContainsFunc(vs, func(v string) bool { return v != "batch" && v != "plain" }) || len(vs) == 2 && vs[0] == vs[1] {
		return nil, fmt.Errorf("-e2e-coupon %q: want batch, plain, or batch,plain", c.e2eCoupon)
	}
	if c.dupPct < 0 || c.dupPct > 100 {
		return nil, fmt.Errorf("-dup-pct %g: want 0 to 100", c.dupPct)
	}
	if c.routerRate > 0 && c.routerSecs < 1 {
		return nil, fmt.Errorf("-router-seconds %d: want at least 1 (or -router-rate 0)", c.routerSecs)
	}
	if err := gcx.Validate(c.gogc, 0); err != nil {
		return nil, fmt.Errorf("-gogc: %w", err)
	}
	return c, nil
}

// targetsGroups are the groups -targets runs: each target of the hot path reads one of them.
const targetsGroups = "relay,peer,router,lean,idle,scaleout,targets"

// targetsSizes sets what -targets runs, for each flag not given on the command line: the
// groups of targetsGroups; the peer comparison on 20,000 orders and the Watermill forwarder
// on 10,000 events (each pipeline's rate, not its total, is compared); no sharded relay run;
// the router group's peak and 2,000 orders/s runs at their full sizes, without its stalled
// runs.
func (c *config) targetsSizes(fs *flag.FlagSet) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	set := func(name, value string) {
		if !given[name] {
			_ = fs.Set(name, value)
		}
	}
	set("only", targetsGroups)
	set("peer-orders", "20000")
	set("forwarder-events", "10000")
	set("relay-shards", "1")
	set("router-big", "0")
	set("router-payloads", "0")
}

// splitList is the comma-separated list s, its items trimmed, empty ones left out.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// plainWants reports whether the plain group runs measurement mode (-plain-modes).
func (c *config) plainWants(mode string) bool {
	for _, m := range strings.Split(c.plainModes, ",") {
		if strings.TrimSpace(m) == mode {
			return true
		}
	}
	return false
}

// want reports whether the measurement group runs in this invocation.
func (c *config) want(group string) bool {
	if c.only == "" {
		return true
	}
	for _, g := range strings.Split(c.only, ",") {
		if strings.TrimSpace(g) == group {
			return true
		}
	}
	return false
}

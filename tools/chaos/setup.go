package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/IBM/sarama"
)

// prepareRouter copies the router binary into the run directory (building it first if it
// is missing) and checks that it has the misbehaving plugin.
func (h *harness) prepareRouter() error {
	// The router binary: a private copy, so a concurrent `make build` cannot swap it mid-run.
	routerSrc := h.o.router
	if !filepath.IsAbs(routerSrc) {
		routerSrc = filepath.Join(h.root, routerSrc)
	}
	if _, err := os.Stat(routerSrc); err != nil {
		h.logf("building %s", routerSrc)
		build := exec.Command("go", "build", "-o", routerSrc, routerPkg)
		build.Dir = filepath.Join(h.root, "tools")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s (in tools/): %v\n%s", routerPkg, err, out)
		}
	}
	h.bin = filepath.Join(h.o.runDir, "router")
	if b, err := os.ReadFile(routerSrc); err != nil {
		return err
	} else if err := os.WriteFile(h.bin, b, 0o755); err != nil {
		return err
	}
	plugins := exec.Command(h.bin, "plugins")
	plugins.Env = cleanEnv()
	if out, err := plugins.CombinedOutput(); err != nil {
		return fmt.Errorf("%s plugins: %v\n%s", routerSrc, err, out)
	} else if !strings.Contains(string(out), misbehaverPlugin) {
		return fmt.Errorf("router %s has no %s plugin: build it from tools/%s (scripts/chaos.sh does)", routerSrc, misbehaverPlugin, routerPkg[2:])
	}
	return nil
}

// checkServices refuses services the run must not restart, and warns of foreign members
// in the run's consumer group.
func (h *harness) checkServices() error {
	// The harness restarts the database and Kafka: never the default instance that other
	// tests use.
	if (h.p.brokerRestarts > 0 || h.p.dbRestarts > 0) && !h.o.allowShared {
		defaultDB := "3306"
		if h.o.dialect.IsPostgres() {
			defaultDB = "5432"
		}
		if isDefaultInstance(h.o.dbAddr, defaultDB) || isDefaultInstance(h.o.brokers[0], "9092") || os.Getenv("INFRA_RUN_DIR") == "" {
			return fmt.Errorf("refusing to restart the default scripts/infra.sh instance (db %s, kafka %s, INFRA_RUN_DIR %q): other tests use it; run through scripts/chaos.sh (a second instance) or pass -allow-shared",
				h.o.dbAddr, h.o.brokers[0], os.Getenv("INFRA_RUN_DIR"))
		}
	}
	// scripts/infra.sh pg-stop/pg-start act on the PostgreSQL of INFRA_PG_PORT (default
	// 5432): it must be the one the run uses.
	if h.p.dbRestarts > 0 && h.o.dialect.IsPostgres() {
		if _, port, _ := net.SplitHostPort(h.o.dbAddr); port != envOr("INFRA_PG_PORT", "5432") {
			return fmt.Errorf("-db-addr %s is not the PostgreSQL scripts/infra.sh restarts (INFRA_PG_PORT %q): set INFRA_PG_PORT to its port", h.o.dbAddr, os.Getenv("INFRA_PG_PORT"))
		}
	}

	// scripts/infra.sh kafka-stop stops the kafka.Kafka of its run dir only, and
	// kafka-start starts this checkout's broker: if the running broker came from another
	// checkout (another INFRA_RUN_DIR, e.g. a CI tree), a "restart" would swap in a broker
	// with other data, which looks exactly like lost messages. Refuse.
	h.wantProps = filepath.Join(h.root, ".run", "kafka", "server.properties")
	if d := os.Getenv("INFRA_RUN_DIR"); d != "" {
		h.wantProps = filepath.Join(d, "kafka", "server.properties")
	}
	if h.p.brokerRestarts > 0 {
		switch got := brokerOrigin(h.o.brokers[0]); got {
		case h.wantProps:
		case "":
			h.logf("WARNING: cannot tell which broker listens on %s (not a local kafka.Kafka?): its restarts may not keep its data", h.o.brokers[0])
		default:
			return fmt.Errorf("the broker on %s was started from %s, not from this checkout (%s): restarting it through scripts/infra.sh would bring up a broker with other data; stop it with its own infra.sh first",
				h.o.brokers[0], got, h.wantProps)
		}
	}

	// Foreign members of the fixed consumer group would take partitions (and our orders) into
	// their own database: say so up front, since the checker would then report lost orders.
	foreign := groupMembers(h.o.brokers)
	if foreign > 0 {
		h.logf("WARNING: consumer group %s has %d members before the run (another router consuming %s?): orders they take go to their database and count as lost here", group, foreign, orderTopic)
	}
	return nil
}

// startProxies starts the proxies between the routers and the database, and between the routers
// and Kafka (when the broker has a CHAOS listener; without it the profile's Kafka faults
// are dropped). closeProxies closes what it started.
func (h *harness) startProxies() error {
	if h.p.galera {
		// The failover connector needs the nodes themselves (one proxy would be one node).
		h.routerDBAddr = h.o.dbAddr
		h.logf("no db proxy: routers connect to the galera nodes %s directly (pkg/dbx's failover connector)", h.o.dbAddr)
	} else {
		px, err := newProxy("db", "127.0.0.1:0", h.o.dbAddr)
		if err != nil {
			return err
		}
		h.px = px
		h.routerDBAddr = px.Addr()
		h.logf("db proxy %s → %s (routers connect through it)", h.px.Addr(), h.o.dbAddr)
	}
	h.routerBrokers = strings.Join(h.o.brokers, ",")
	if h.p.cluster && h.o.kafkaChaos != "" {
		h.logf("the cluster is not proxied: routers talk to its three brokers directly (Kafka network faults are not injected)")
		h.o.kafkaChaos = ""
	}
	if h.o.kafkaChaos != "" {
		if h.p.brokerRestarts > 0 && os.Getenv("INFRA_KAFKA_CHAOS_PORT") == "" {
			return errors.New("-kafka-chaos-listener without INFRA_KAFKA_CHAOS_PORT in the environment: scripts/infra.sh kafka-start would restart the broker without its CHAOS listener")
		}
		kpx, err := newProxy("kafka", h.o.kafkaProxy, h.o.kafkaChaos)
		if err != nil {
			return err
		}
		h.kpx = kpx
		if err := checkAdvertised(h.kpx.Addr()); err != nil {
			return fmt.Errorf("kafka proxy %s → %s: %w", h.kpx.Addr(), h.o.kafkaChaos, err)
		}
		h.routerBrokers = h.kpx.Addr()
		h.logf("kafka proxy %s → CHAOS listener %s, advertised as %s: routers bootstrap, fetch and produce through it", h.kpx.Addr(), h.o.kafkaChaos, h.kpx.Addr())
	} else {
		if h.p.kLatencies+h.p.kResets+h.p.kCuts > 0 {
			h.logf("WARNING: no -kafka-chaos-listener (INFRA_KAFKA_CHAOS_PORT): Kafka network faults are NOT injected")
		}
		h.p.kLatencies, h.p.kResets, h.p.kCuts = 0, 0, 0
	}
	return nil
}

func (h *harness) closeProxies() {
	if h.kpx != nil {
		h.kpx.Close()
	}
	if h.px != nil {
		h.px.Close()
	}
}

// freshState writes the routers' configuration, migrates the run's database from scratch,
// and records where the run starts on Kafka (the misbehaving plugin's group moved there).
func (h *harness) freshState(ctx context.Context) error {
	h.cfgPath = filepath.Join(h.o.runDir, "chaos.yaml")
	cfg := chaosConfig(h.info.Prefix, h.o.seed)
	if h.p.shards > 1 {
		cfg = strings.Replace(cfg, "relay:\n", fmt.Sprintf("relay:\n  shards: %d\n", h.p.shards), 1)
	}
	if err := os.WriteFile(h.cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	h.adminDSN = dsn(h.o.dialect, "onceflow_admin:onceflow_admin", h.o.dbAddr, h.o.dbName)
	h.appDSN = dsn(h.o.dialect, "onceflow:onceflow", h.o.dbAddr, h.o.dbName)
	h.baseEnv = append(cleanEnv(), "ONCEFLOW_CONFIG="+h.cfgPath, "ONCEFLOW_KAFKA_BROKERS="+strings.Join(h.o.brokers, ","),
		"ONCEFLOW_DB_ADMIN_DSN="+h.adminDSN)
	migrate := exec.CommandContext(ctx, h.bin, "migrate", "--reset")
	migrate.Env = append(h.baseEnv, "ONCEFLOW_DB_DSN="+h.appDSN)
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("router migrate --reset (%s): %v\n%s", h.o.dbName, err, out)
	}
	h.logf("database %s (%s, %s): fresh schema", h.o.dbName, h.o.dialect, h.o.dbAddr)

	var err error
	if h.info.StartOffsets, err = TopicEnds(h.o.brokers, orderTopic, grantedTopic); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	// The misbehaving plugin's group starts where the run starts: what earlier runs left on
	// order-paid is not this run's, and its fresh database has no rows for it.
	if err := commitOffsets(h.o.brokers, misbehaverGroup, orderTopic, h.info.StartOffsets[orderTopic]); err != nil {
		return fmt.Errorf("kafka: group %s to the run's start offsets (is a router of it running?): %w", misbehaverGroup, err)
	}
	h.logf("consumer group %s: offsets set to the end of %s", misbehaverGroup, orderTopic)
	return nil
}

func chaosConfig(prefix string, seed uint64) string {
	return fmt.Sprintf(`# Generated by tools/chaos for run %s.
kafka:
  session_timeout: 6s
  rebalance_timeout: 10s
  heartbeat: 1s
inbox:
  backoff_initial: 20ms
  backoff_max: 1s
  # Delayed redelivery on a short clock: a delivery whose attempts ran out during a fault
  # waits a second, not minutes, for its one more round, and the drain sees it end.
  delayed_retries: 1
  delayed_backoff: 1s
  delayed_backoff_max: 2s
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

// cleanEnv is the harness's environment without ONCEFLOW_* settings (the run sets its own)
// and without a relay crash point (faults.go arms one router at a time).
func cleanEnv() []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "ONCEFLOW_") && !strings.HasPrefix(e, relayCrashEnv+"=") {
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
			return fmt.Errorf("broker %d is advertised at %s, not at the proxy %s (is the CHAOS listener advertised on the proxy's port? scripts/infra.sh INFRA_KAFKA_CHAOS_ADVERTISED_PORT)", b.ID(), b.Addr(), proxyAddr)
		}
	}
	if len(client.Brokers()) == 0 {
		return errors.New("no broker in the metadata")
	}
	return nil
}

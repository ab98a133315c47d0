package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The galera profile (scripts/chaos.sh CHAOS_PROFILE=galera): the run's database is the
// three-node Galera cluster of the chaos instance (scripts/infra.sh galera-up), which the
// routers reach directly through pkg/dbx's failover connector (a DSN listing the three
// nodes; no DB proxy). Its faults: SIGKILL of the node the routers write to, the node
// rejoining (IST, else SST) and Synced before the next kill; router kills, joins, relay
// crashes and the Kafka faults as in the short profile. Before the faults, a fault-free
// phase on the single node (-speed-single) and on the cluster measures orders/s on each.

// speedOrders is the size of each fault-free speed phase.
const speedOrders = 6000

// galeraNodes are the cluster's node addresses (-db-addr), node 1 first.
func (h *harness) galeraNodes() []string { return dsnServers(dsn(h.o.dialect, "", h.o.dbAddr, "")) }

// writeNode is the node (1-3) most of the routers' connections are on (the monitor user
// reads each node's processlist), 0 when no node has any.
func (h *harness) writeNode() (int, string) {
	best, bestN, desc := 0, 0, []string{}
	for i, addr := range h.galeraNodes() {
		db, err := openDB(dsn(h.o.dialect, "onceflow_monitor:onceflow_monitor", addr, ""))
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var n int
		err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'onceflow' AND DB = ?`, h.o.dbName).Scan(&n)
		cancel()
		db.Close()
		if err != nil {
			desc = append(desc, fmt.Sprintf("node %d: -", i+1))
			continue
		}
		desc = append(desc, fmt.Sprintf("node %d: %d", i+1, n))
		if n > bestN {
			best, bestN = i+1, n
		}
	}
	return best, strings.Join(desc, ", ")
}

// synced reports whether node i (1-3) is Synced.
func (h *harness) synced(i int) bool {
	nodes := h.galeraNodes()
	db, err := openDB(dsn(h.o.dialect, "onceflow_monitor:onceflow_monitor", nodes[i-1], ""))
	if err != nil {
		return false
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var name, st string
	return db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'wsrep_local_state'").Scan(&name, &st) == nil && st == "4"
}

// dbNodeKill SIGKILLs the routers' write node once all three are Synced, keeps it down for
// e.dur, and starts it again: it rejoins (scripts/infra.sh galera-start waits until it is
// Synced) before the infra lock lets the next kill run.
func (h *harness) dbNodeKill(e event) {
	h.infraMu.Lock()
	defer h.infraMu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for !(h.synced(1) && h.synced(2) && h.synced(3)) {
		if time.Now().After(deadline) {
			h.harnessErr("db node kill: the three galera nodes not Synced within 60s")
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	n, desc := h.writeNode()
	if n == 0 {
		h.harnessErr("db node kill: no node has the routers' connections (%s)", desc)
		return
	}
	h.logf("db node %d (%s) SIGKILL: the routers write through it (their connections: %s); restart in %s",
		n, h.galeraNodes()[n-1], desc, e.dur.Round(100*time.Millisecond))
	if err := h.infra("galera-kill", strconv.Itoa(n)); err != nil {
		h.harnessErr("galera-kill %d: %v (see infra.log)", n, err)
		return
	}
	h.dbNodeKills.Add(1)
	time.Sleep(e.dur)
	t0 := time.Now()
	for i := 0; ; i++ {
		err := h.infra("galera-start", strconv.Itoa(n))
		if err == nil {
			break
		}
		if i == 2 {
			h.harnessErr("galera-start %d failed 3 times: %v (see infra.log)", n, err)
			return
		}
		time.Sleep(2 * time.Second)
	}
	after, _ := h.writeNode()
	h.logf("db node %d rejoined by %s and is Synced after %.1fs; the routers now write through node %d", n, h.rejoinKind(n), time.Since(t0).Seconds(), after)
}

// rejoinKind is how node n last caught up, from its log: IST or SST.
func (h *harness) rejoinKind(n int) string {
	b, err := os.ReadFile(filepath.Join(os.Getenv("INFRA_RUN_DIR"), "galera", fmt.Sprintf("node-%d", n), "mysqld.log"))
	if err != nil {
		return "IST or SST"
	}
	s := string(b)
	ist, sst := strings.LastIndex(s, "IST received"), strings.LastIndex(s, "SST received")
	switch {
	case ist < 0 && sst < 0:
		return "IST or SST"
	case ist > sst:
		return "IST"
	}
	return "SST"
}

// speed is a fault-free phase on the server(s) at addr: a fresh database, routers a and b
// (the coupon granter only), speedOrders orders sent as fast as `router produce` sends,
// and the orders per second from the first send until every order is terminal and its event
// published.
func (h *harness) speed(ctx context.Context, what, addr string) (float64, error) {
	admin := dsn(h.o.dialect, "onceflow_admin:onceflow_admin", addr, h.o.dbName)
	app := dsn(h.o.dialect, "onceflow:onceflow", addr, h.o.dbName)
	// Not under the run's prefix: the checker audits only the faulted phase's orders.
	prefix := fmt.Sprintf("speed%s-%s", what, h.info.Prefix)
	cfg := filepath.Join(h.o.runDir, "speed.yaml")
	// No injected step failures: every order ends GRANTED or FAILED on its first delivery.
	conf := strings.Replace(chaosConfig(prefix, h.o.seed), "step_failure_rate: 0.1", "step_failure_rate: 0", 1)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return 0, err
	}
	env := append(cleanEnv(), "ONCEFLOW_CONFIG="+cfg, "ONCEFLOW_KAFKA_BROKERS="+strings.Join(h.o.brokers, ","),
		"ONCEFLOW_DB_ADMIN_DSN="+admin, "ONCEFLOW_DB_DSN="+app)
	migrate := exec.CommandContext(ctx, h.bin, "migrate", "--reset")
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("speed %s: router migrate --reset: %v\n%s", what, err, out)
	}
	dir := filepath.Join(h.o.runDir, "speed-"+what)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	var slots []*slot
	for _, n := range []string{"a", "b"} {
		s := newSlot(n, h.bin, []string{"run", "--plugins", "coupon-granter"}, env, dir, h.logf)
		s.start()
		slots = append(slots, s)
	}
	defer func() {
		for _, s := range slots {
			s.close(40 * time.Second)
		}
	}()
	time.Sleep(3 * time.Second)
	db, err := openDB(app)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, h.bin, "produce", "--orders", strconv.Itoa(speedOrders), "--dup-rate", "0", "--prefix", prefix,
		"--seed", fmt.Sprint(h.o.seed), "--ledger", filepath.Join(dir, "ledger.txt"))
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("speed %s: router produce: %v: %s", what, err, lastLine(string(out)))
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var n, pending int
		err := db.QueryRowContext(ctx, `SELECT
 (SELECT COUNT(*) FROM coupon_grant WHERE order_id LIKE ? AND state IN ('GRANTED', 'FAILED'))
 + (SELECT COUNT(*) FROM inbox WHERE biz_type = 'coupon' AND dedup_key LIKE ? AND status = 'failed' AND COALESCE(reason, '') <> 'delayed'),
 (SELECT COUNT(*) FROM outbox WHERE published_at IS NULL)`, likePrefix(prefix), likePrefix(prefix)).Scan(&n, &pending)
		if err == nil && n >= speedOrders && pending == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("speed %s: %d/%d orders terminal after 5 minutes (%v)", what, n, speedOrders, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	el := time.Since(t0)
	rate := float64(speedOrders) / el.Seconds()
	h.logf("speed %s (%s): %d orders in %.1fs: %.0f orders/s (fault-free, routers a and b)", what, addr, speedOrders, el.Seconds(), rate)
	return rate, nil
}

// galeraSummary is the galera profile's CHAOS line.
func galeraSummary(rep Report, info runInfo, extra []string) string {
	lag := ""
	if rep.LagChecked {
		lag = fmt.Sprintf(" lag=%d", rep.LagTotal)
	}
	head := fmt.Sprintf("profile=galera orders=%d db_node_kills=%d router_kills=%d broker_restarts=%d lost=%d duplicates=%d%s orders_per_s_galera=%.0f orders_per_s_single=%.0f",
		rep.Orders, info.DBNodeKills, info.Kills, info.BrokerRestar, rep.Lost, rep.Duplicates(), lag, info.SpeedGalera, info.SpeedSingle)
	if len(rep.Violations) == 0 && len(extra) == 0 {
		return "CHAOS ok " + head
	}
	var parts []string
	for _, v := range rep.Violations {
		parts = append(parts, fmt.Sprintf("%s=%d", v.Kind, v.Count))
	}
	parts = append(parts, extra...)
	return "CHAOS FAIL " + head + " violations: " + strings.Join(parts, " ")
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// audit runs the checker on what the run left (then, with -inject, injects the faults and
// requires the checker to report each), prints its report and the CHAOS line, and returns
// the exit code: 0 for CHAOS ok, 1 for CHAOS FAIL.
func audit(ctx context.Context, c clock, o options, info runInfo, appDSN, adminDSN string, kinds []string, harnessErrs []string) (int, error) {
	cc := CheckConfig{DSN: appDSN, Brokers: info.Brokers, GrantedTopic: grantedTopic, OrderTopic: orderTopic,
		StartOffsets: info.StartOffsets, Prefix: info.Prefix, Ledgers: info.Ledgers,
		Misbehaver: misbehaverBiz, Groups: groupsOf(info), LagWait: 30 * time.Second}
	if info.NoMisbehaver {
		cc.Misbehaver = ""
	}
	rep, err := Check(ctx, cc)
	if err != nil {
		return 2, err
	}
	c.printReport(rep)
	if claims, n, err := ackedSkipped(o.runDir, group); err != nil {
		c.logf("checker: the routers' logs: %v", err)
	} else {
		c.logf("checker: acked_skipped=%d (offsets of %s acked past a committed offset and not handed out again, in %d claims; from the routers' logs)", n, group, claims)
	}
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
		c.logf("before injection: %s", runSummary(rep, info, extra))
		admin, err := openDB(adminDSN)
		if err != nil {
			return 2, err
		}
		defer admin.Close()
		done, err := inject(ctx, admin, info.Prefix, kinds, injectTarget{Brokers: info.Brokers, GrantedTopic: grantedTopic,
			OrderTopic: orderTopic, Misbehaver: misbehaverBiz})
		for _, d := range done {
			c.logf("injected %s", d)
		}
		if err != nil {
			return 2, err
		}
		if rep, err = Check(ctx, cc); err != nil {
			return 2, err
		}
		c.printReport(rep)
		for _, k := range kinds {
			if rep.Has(injectKinds[k]) {
				c.logf("injected %s → reported as %s", k, injectKinds[k])
			} else {
				c.logf("injected %s → NOT REPORTED (checker bug)", k)
				extra = append(extra, "undetected-injection("+k+")")
			}
		}
	}
	fmt.Printf("chaos: runtime %.0fs (run dir %s)\n", time.Since(c.t0).Seconds(), o.runDir)
	line := runSummary(rep, info, extra)
	fmt.Println(line)
	if strings.HasPrefix(line, "CHAOS ok") {
		return 0, nil
	}
	return 1, nil
}

// checkOnly audits an earlier run again (-check-only), from its run.json.
func checkOnly(ctx context.Context, c clock, o options, kinds []string) (int, error) {
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
	c.logf("auditing run %s (prefix %s, database %s)", o.runDir, info.Prefix, info.DB)
	d, err := parseDialect(string(info.Dialect))
	if err != nil {
		return 2, fmt.Errorf("-check-only: %s/run.json: %w", o.runDir, err)
	}
	return audit(ctx, c, o, info, dsn(d, "onceflow:onceflow", info.DBAddr, info.DB), dsn(d, "onceflow_admin:onceflow_admin", info.DBAddr, info.DB), kinds, nil)
}

// printReport logs the checker's figures and prints its violations.
func (c clock) printReport(r Report) {
	var reasons []string
	for k, n := range r.QuarantineReasons {
		reasons = append(reasons, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(reasons)
	c.logf("checker: orders=%d granted=%d failed=%d quarantined=%d %v lost=%d", r.Orders, r.Granted, r.Failed, r.Quarantined, reasons, r.Lost)
	c.logf("checker: deliveries=%d (order-paid messages of the run on Kafka; ledgers declare %d, segment re-sends add to it) duplicates_blocked=%d redeliveries≈%d poison=%d quarantined_as_poison=%d",
		r.KafkaDeliveries, r.LedgerDeliveries, r.DuplicatesBlocked, r.Redeliveries(), r.LedgerPoison, r.PoisonQuarantined)
	c.logf("checker: grant_events=%d (distinct CouponGranted event ids, read_committed) duplicate_events=%d duplicate_coupons=%d transitions=%d",
		r.GrantEvents, r.DupEvents, r.DupCoupons, r.Transitions)
	if len(r.PoisonKinds) > 0 {
		var kinds []string
		for _, k := range poisonKinds {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, r.PoisonKinds[k]))
		}
		c.logf("checker: poison records of the run on %s: %d (%s); inbox rows quarantined as poison: %s %d, %s %d",
			orderTopic, r.PoisonOnKafka, strings.Join(kinds, " "), "coupon", r.PoisonQuarantined, misbehaverBiz, r.MisbehaverPoison)
	}
	if r.MisbehaverWant != nil {
		c.logf("checker: %s (biz type %s) outcomes as planned: %s", misbehaverPlugin, misbehaverBiz, misbehaverSummary(r))
	}
	if r.LagChecked {
		c.logf("checker: committed lag %d: %s", r.LagTotal, lagSummary(r.Lags))
	}
	for _, v := range r.Violations {
		fmt.Printf("VIOLATION %s (%d): %s\n", v.Kind, v.Count, strings.Join(v.Examples, "; "))
	}
}

// runSummary is the CHAOS line (clusterSummary's), naming the database when not MariaDB.
func runSummary(rep Report, info runInfo, extra []string) string {
	if info.Profile == "galera" {
		return galeraSummary(rep, info, extra)
	}
	return onDB(clusterSummary(rep, info, extra), info.Dialect)
}

// onDB names the run's database in the CHAOS line when it is not MariaDB, right after
// ok/FAIL: "CHAOS ok db=postgres orders=…".
func onDB(line string, d dbx.Dialect) string {
	if d == "" || d == dbx.MariaDB {
		return line
	}
	for _, p := range []string{"CHAOS ok ", "CHAOS FAIL "} {
		if rest, ok := strings.CutPrefix(line, p); ok {
			return p + "db=" + string(d) + " " + rest
		}
	}
	return line
}

// clusterSummary is the CHAOS line without the database: summary's for the one-broker
// profiles; on the cluster it names the profile and counts broker kills (coordinator kills
// among them), controlled broker restarts and router kills, and for the soak the rebalances
// and the routers' RSS.
func clusterSummary(rep Report, info runInfo, extra []string) string {
	c := info.Cluster
	if c == nil {
		return summary(rep, info.Kills, info.BrokerRestar, info.DBRestarts, extra)
	}
	lag := ""
	if rep.LagChecked {
		lag = fmt.Sprintf(" lag=%d", rep.LagTotal)
	}
	soak := ""
	if info.Profile == "soak" {
		soak = fmt.Sprintf(" rebalances=%d router_rss_max_mb=%.0f rss_growth_mb_per_100k_orders=%.1f", c.Rebalances, c.RSSMaxMB, c.RSSGrowthMB)
	}
	head := fmt.Sprintf("profile=%s orders=%d broker_kills=%d coordinator_kills=%d broker_restarts=%d router_kills=%d db_restarts=%d%s lost=%d duplicates=%d%s",
		info.Profile, rep.Orders, c.brokerKills(), c.CoordKills, c.NodeRestarts, info.Kills, info.DBRestarts, soak, rep.Lost, rep.Duplicates(), lag)
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

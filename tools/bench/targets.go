package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// targetsGroup runs last: one more latency run at 30 % of this run's own peak end-to-end
// rate, then the targets, each computed from this run's figures so they hold on a slower or
// faster machine alike:
//
//   - e2e exactly once ≥ 10× the peer pipeline on the same input (ratio e2e_vs_peer);
//   - inbox overhead ≤ 15 %, the median of the interleaved rounds (with their spread);
//   - p99 ≤ 100 ms at 30 % of the run's peak e2e rate, and at 2,000 orders/s;
//   - relay exactly once ≥ 20× the Watermill forwarder;
//   - the router binary's peak resident memory ≤ 150 MB, at its peak rate and at 2,000
//     orders/s, and ≤ 300 MB with big records waiting for a stalled database, every one of
//     them quarantined once it is back, and with orders under inbox.max_payload_bytes
//     waiting whole for it, every one of them granted once it is back (router.go);
//   - the incident's load (seed_load, the router's default settings) ≥ 1,000 orders/s with
//     no rebalance and no duplicate coupon;
//   - PostgreSQL end to end ≥ 70 % of MariaDB's, the median of the databases group's rounds;
//   - e2e ≥ 0.80 of the in-process inbox ceiling: the e2e group's median over the batch
//     group's inbox median (e2e_vs_inbox_ceiling_pct, in per cent), beside the same ratio from the databases
//     group, whose rounds run the two back to back (e2e_vs_inbox_interleaved_pct);
//   - the router binary's own CPU per order at its peak ≤ 32 µs (router_cpu_us_per_order);
//
// and the targets of the hot path (hotPathTargets). It prints them as BENCH name=targets with
// pass, fail or missing (the measurement did not run in this invocation) for each, and the
// bench process's peak resident memory. With -targets the line holds the hot path's alone.
func (s *suite) targetsGroup(ctx context.Context) error {
	hot := s.hotPathTargets()
	if s.cfg.targets {
		s.report("targets", hot...)
		return nil
	}
	peak := s.field("e2e", "orders_per_s", map[string]string{"mode": "batch", "offered": "preloaded"})
	p99Peak30 := -1.0
	if peak > 0 {
		rate := int(0.3 * peak)
		res, err := s.benchE2E(ctx, "batch", false, 5000, strconv.Itoa(rate))
		if err != nil {
			return fmt.Errorf("targets: latency at 30 %% of the peak: %w", err)
		}
		p99Peak30 = res.lat[rate][1]
	}
	vsPeer := s.field("ratio", "e2e_vs_peer", nil)
	overhead := s.field("inbox", "overhead_pct_vs_unsafe", map[string]string{"mode": "batch"})
	ohMin := s.field("inbox", "overhead_min", map[string]string{"mode": "batch"})
	ohMax := s.field("inbox", "overhead_max", map[string]string{"mode": "batch"})
	p99At2000 := s.field("e2e", "p99_ms", map[string]string{"mode": "batch", "offered_per_s": "2000"})
	relay := s.field("relay", "events_per_s", map[string]string{"mode": "exactly_once"})
	fwd := s.field("watermill_forwarder", "events_per_s", nil)
	vsFwd := -1.0
	if relay > 0 && fwd > 0 {
		vsFwd = relay / fwd
	}
	rssPeak := s.field("router", "max_rss_mb", map[string]string{"mode": "peak"})
	rss2000 := s.field("router", "max_rss_mb", map[string]string{"mode": "rate2000"})
	rssStalled := s.field("router", "max_rss_mb", map[string]string{"mode": "stalled"})
	stalledOK := s.field("router", "quarantined", map[string]string{"mode": "stalled"}) == s.field("router", "big_records", map[string]string{"mode": "stalled"})
	rssPayloads := s.field("router", "max_rss_mb", map[string]string{"mode": "stalled_payloads"})
	payloadsOK := s.field("router", "granted", map[string]string{"mode": "stalled_payloads"}) == s.field("router", "payloads", map[string]string{"mode": "stalled_payloads"})
	seed := s.field("seed_load", "orders_per_s", map[string]string{"mode": "batch"})
	pgVsMaria := s.field("ratio", "median_pct", map[string]string{"mode": "postgres_vs_mariadb_e2e"})
	seedClean := s.field("seed_load", "rebalances", map[string]string{"mode": "batch"}) == 0 && s.field("seed_load", "duplicate_coupons", map[string]string{"mode": "batch"}) == 0
	ceiling := s.field("inbox", "orders_per_s", map[string]string{"mode": "batch"})
	vsCeiling := -1.0
	if peak > 0 && ceiling > 0 {
		vsCeiling = 100 * peak / ceiling
	}
	vsCeilingInterleaved := -1.0
	if in, e := s.field("db_compare", "inbox_orders_per_s", map[string]string{"db": "mariadb"}), s.field("db_compare", "e2e_orders_per_s", map[string]string{"db": "mariadb"}); in > 0 && e > 0 {
		vsCeilingInterleaved = 100 * e / in
	}
	routerCPU := s.field("router", "cpu_us_per_order", map[string]string{"mode": "peak"})
	// The hot path's targets follow the older ones; the fields both name come once.
	s.report("targets", append([]any{
		"e2e_vs_peer", vsPeer, "e2e_vs_peer_10x", verdict(vsPeer, vsPeer >= 10),
		"inbox_overhead_pct", overhead, "overhead_spread", fmt.Sprintf("%.1f..%.1f", ohMin, ohMax), "inbox_overhead_15pct", verdict(overhead, overhead <= 15),
		"p99_ms_at_30pct_peak", p99Peak30, "p99_30pct_peak_100ms", verdict(p99Peak30, p99Peak30 <= 100),
		"p99_ms_at_2000", p99At2000, "p99_2000_100ms", verdict(p99At2000, p99At2000 <= 100),
		"relay_vs_forwarder", vsFwd, "relay_20x_forwarder", verdict(vsFwd, vsFwd >= 20),
		"bench_max_rss_mb", maxRSSMB(),
		"router_rss_peak_mb", rssPeak, "router_rss_2000_mb", rss2000,
		"router_rss", verdict(min(rssPeak, rss2000), rssPeak <= 150 && rss2000 <= 150),
		"router_rss_stalled_mb", rssStalled, "router_rss_stalled_300", verdict(rssStalled, rssStalled <= 300 && stalledOK),
		"router_rss_payloads_mb", rssPayloads, "router_rss_payloads_300", verdict(rssPayloads, rssPayloads <= 300 && payloadsOK),
		"seed_orders_per_s", seed, "seed_1000", verdict(seed, seed >= 1000 && seedClean),
		"postgres_vs_mariadb_e2e_pct", pgVsMaria, "postgres_70pct", verdict(pgVsMaria, pgVsMaria >= 70),
		"e2e_vs_inbox_ceiling_pct", vsCeiling, "e2e_vs_inbox_interleaved_pct", vsCeilingInterleaved, "e2e_080_ceiling", verdict(vsCeiling, vsCeiling >= 80),
		"router_cpu_32us", verdict(routerCPU, routerCPU <= 32)}, withoutKeys(hot, "e2e_vs_peer", "e2e_vs_peer_10x", "relay_vs_forwarder")...)...)
	return nil
}

// verdict is a target's outcome: missing when its figure v is not there (below 0), pass
// when ok, fail otherwise.
func verdict(v float64, ok bool) string {
	switch {
	case v < 0:
		return "missing"
	case ok:
		return "pass"
	}
	return "fail"
}

// hotPathTargets are the targets of the hot path at the machine's floor, each from this
// run's figures (pass, fail or missing):
//
//   - the router binary's own CPU per order at its peak ≤ 20 µs (router group, mode=peak);
//   - the CPU per order of every process of that run, the router, MariaDB and the broker,
//     ≤ 60 µs (its total_cpu_us_per_order);
//   - end to end ≥ 10× the Watermill peer on the same input (peer group, ratio e2e_vs_peer);
//   - the router binary idle on an empty topic ≤ 5 ms of CPU per second (idle group; the
//     broker's added CPU beside it);
//   - p99 ≤ 30 ms at 2,000 orders/s offered to the router binary (router group, rate2000),
//     the lean pipeline's p99 paced alike beside it;
//   - the exactly-once relay ≥ 50× Watermill's forwarder (relay group);
//   - during a scale-out no partition stalls more than 2 s (the scaleout group's
//     max_stall_ms with the default cooperative-sticky strategy).
//
// The calibration of the run's start and one taken now go with them: the figures compare
// only between runs of similar calibration.
func (s *suite) hotPathTargets() []any {
	s.calibrate("targets")
	routerCPU := s.field("router", "cpu_us_per_order", map[string]string{"mode": "peak"})
	allCPU := s.field("router", "total_cpu_us_per_order", map[string]string{"mode": "peak"})
	vsPeer := s.field("ratio", "e2e_vs_peer", nil)
	idle := s.field("idle", "router_ms_per_s", nil)
	idleKafka := s.field("idle", "kafka_added_ms_per_s", nil)
	p99 := s.field("router", "p99_ms", map[string]string{"mode": "rate2000"})
	relay := s.field("relay", "events_per_s", map[string]string{"mode": "exactly_once"})
	fwd := s.field("watermill_forwarder", "events_per_s", nil)
	vsFwd := -1.0
	if relay > 0 && fwd > 0 {
		vsFwd = relay / fwd
	}
	stall := s.field("scaleout", "max_stall_ms", map[string]string{"strategy": "cooperative-sticky"})
	// The lean pipeline on the same input in the same run (lean.go): the floor the CPU
	// targets were set against, as ratios the machine's speed does not move.
	peak := map[string]string{"mode": "peak"}
	leanCPU := s.field("lean", "lean_cpu_us_per_order", peak)
	leanAll := s.field("lean", "total_cpu_us_per_order", peak)
	// Its p99 paced as the router's rate2000 run: the floor of the p99 target.
	leanP99 := s.field("lean", "p99_ms", map[string]string{"mode": "rate2000"})
	return []any{
		"calibration_start_ms", s.field("calibration", "work_ms", map[string]string{"when": "start"}),
		"calibration_targets_ms", s.field("calibration", "work_ms", map[string]string{"when": "targets"}),
		"router_cpu_us_per_order", routerCPU, "router_cpu_20us", verdict(routerCPU, routerCPU <= 20),
		"all_cpu_us_per_order", allCPU, "all_cpu_60us", verdict(allCPU, allCPU <= 60),
		"e2e_vs_peer", vsPeer, "e2e_vs_peer_10x", verdict(vsPeer, vsPeer >= 10),
		"idle_router_ms_per_s", idle, "idle_kafka_added_ms_per_s", idleKafka, "idle_router_5ms", verdict(idle, idle <= 5),
		"router_p99_ms_at_2000", p99, "router_p99_2000_30ms", verdict(p99, p99 <= 30), "lean_p99_ms_at_2000", leanP99,
		"relay_vs_forwarder", vsFwd, "relay_50x_forwarder", verdict(vsFwd, vsFwd >= 50),
		"scaleout_max_stall_ms", stall, "scaleout_stall_2s", verdict(stall, stall <= 2000),
		"lean_cpu_us_per_order", leanCPU, "lean_all_cpu_us_per_order", leanAll,
		"router_vs_lean_cpu", ratioOf(routerCPU, leanCPU), "all_vs_lean_all_cpu", ratioOf(allCPU, leanAll),
		"router_vs_lean_p99", ratioOf(p99, leanP99),
	}
}

// ratioOf is a / b, or -1 when either was not measured.
func ratioOf(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return -1
	}
	return a / b
}

// withoutKeys is kv (alternating keys and values) without the pairs of keys.
func withoutKeys(kv []any, keys ...string) []any {
	var out []any
	for i := 0; i+1 < len(kv); i += 2 {
		if !slices.Contains(keys, kv[i].(string)) {
			out = append(out, kv[i], kv[i+1])
		}
	}
	return out
}

// field returns the value of key in the last untagged result called name whose fields
// include every pair of match; -1 when there is none (the group did not run).
func (s *suite) field(name, key string, match map[string]string) float64 {
	for i := len(s.results) - 1; i >= 0; i-- {
		r := s.results[i]
		if r.name != name {
			continue
		}
		fields := map[string]string{}
		for _, kv := range r.fields {
			fields[kv[0]] = kv[1]
		}
		if _, tagged := fields["round"]; tagged {
			continue
		}
		ok := true
		for k, v := range match {
			ok = ok && fields[k] == v
		}
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(fields[key], 64); err == nil {
			return v
		}
	}
	return -1
}

// maxRSSMB is this process's peak resident memory (VmHWM) in MiB: the pipelines of the
// e2e, peer and http runs all run in it.
func maxRSSMB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err == nil {
				return kb / 1024
			}
		}
	}
	return -1
}

package main

import "fmt"

// peerRows are the HTTP entrance and the peer pipeline beside onceflow on the same input,
// when the run measured them.
func (b benchRun) peerRows(row func(m, r, t string)) {
	if h, ok := b.one("http_claims", "requests", ""); ok {
		row(fmt.Sprintf("`http_claims`: POST /v1/claims over HTTP, %s clients, %s of %s requests with an earlier request's Idempotency-Key",
			h.get("clients"), f(h.num("duplicate_keys"), 0), f(h.num("requests"), 0)),
			fmt.Sprintf("**%s requests/s**, p50 %s ms, p99 **%s ms**; %s created, %s replayed, %s × 409; %s duplicate coupons",
				rate(h.num("requests_per_s")), f(h.num("p50_ms"), 1), f(h.num("p99_ms"), 1), f(h.num("created"), 0), f(h.num("replayed"), 0),
				f(h.num("busy_409"), 0), f(h.num("duplicate_coupons"), 0)),
			fmt.Sprintf("≥ 2,000 requests/s: %s; p99 ≤ 50 ms: %s; 0 duplicate coupons: %s", verdict(h.num("requests_per_s") >= 2000),
				verdict(h.num("p99_ms") <= 50), verdict(h.num("duplicate_coupons") == 0)))
	}
	peer, ok1 := b.one("peer_watermill", "orders", "")
	once, ok2 := b.one("peer_onceflow", "orders", "")
	if ok1 && ok2 {
		line := func(r record) string {
			return fmt.Sprintf("%s orders/s, %s µs CPU per order, p99 %s ms at %s/s, **%s duplicate events**", rate(r.num("orders_per_s")),
				f(r.num("cpu_us_per_order"), 0), f(r.num("p99_ms"), 1), f(r.num("offered_per_s"), 0), f(r.num("duplicate_events"), 0))
		}
		row(fmt.Sprintf("`peer_watermill` / `peer_onceflow`: %s orders, %s deliveries (%s twice); a plain Watermill pipeline (INSERT guarded by a unique key, then a synchronous publish) and onceflow on the same input",
			f(peer.num("orders"), 0), f(peer.num("deliveries"), 0), twice(peer)), "peer: "+line(peer)+"; onceflow: "+line(once), "—")
	}
}

// databasesRow is the databases group: the same inbox and end-to-end runs on MariaDB and on
// PostgreSQL, when the run measured them.
func (b benchRun) databasesRow(row func(m, r, t string)) {
	m, ok1 := b.one("db_compare", "db", "mariadb")
	p, ok2 := b.one("db_compare", "db", "postgres")
	r, ok3 := b.one("ratio", "mode", "postgres_vs_mariadb_e2e")
	if !ok1 || !ok2 || !ok3 {
		return
	}
	line := func(x record) string {
		return fmt.Sprintf("inbox %s orders/s (server %s µs CPU per order), end to end %s orders/s (server %s µs)", rate(x.num("inbox_orders_per_s")),
			f(x.num("inbox_db_cpu_us_per_order"), 0), rate(x.num("e2e_orders_per_s")), f(x.num("e2e_db_cpu_us_per_order"), 0))
	}
	row(fmt.Sprintf("`db_compare`: the inbox in-process and the pipeline end to end on MariaDB and on PostgreSQL, %s rounds back to back", m.get("rounds")),
		fmt.Sprintf("MariaDB: %s; PostgreSQL: %s; PostgreSQL end to end **%s %%** of MariaDB's (rounds %s..%s)", line(m), line(p),
			f(r.num("median_pct"), 1), f(r.num("min_pct"), 1), f(r.num("max_pct"), 1)),
		fmt.Sprintf("PostgreSQL ≥ 70 %%: %s", verdict(r.num("median_pct") >= 70)))
}

// targetsRow is the run's targets line, when the run computed it.
func (b benchRun) targetsRow(row func(m, r, t string)) {
	t, ok := b.one("targets", "e2e_vs_peer", "")
	if !ok {
		return
	}
	rss := ""
	if t.has("router_rss") {
		rss = fmt.Sprintf("; router binary peak RSS %s MB at its peak rate, %s MB at 2,000/s (%s)",
			f(t.num("router_rss_peak_mb"), 0), f(t.num("router_rss_2000_mb"), 0), t.get("router_rss"))
	}
	if t.has("router_rss_stalled_300") {
		rss += fmt.Sprintf(", %s MB with big records waiting for a stalled database (%s)", f(t.num("router_rss_stalled_mb"), 0), t.get("router_rss_stalled_300"))
	}
	if t.has("router_rss_payloads_300") {
		rss += fmt.Sprintf(", %s MB with orders of 1 MB waiting whole for it (%s)", f(t.num("router_rss_payloads_mb"), 0), t.get("router_rss_payloads_300"))
	}
	if t.has("seed_1000") {
		rss += fmt.Sprintf("; the incident's load with the default settings %s orders/s (%s)", rate(t.num("seed_orders_per_s")), t.get("seed_1000"))
	}
	if t.has("postgres_70pct") {
		rss += fmt.Sprintf("; PostgreSQL end to end %s %% of MariaDB's (%s)", f(t.num("postgres_vs_mariadb_e2e_pct"), 1), t.get("postgres_70pct"))
	}
	if t.has("e2e_080_ceiling") {
		rss += fmt.Sprintf("; e2e **%s %%** of the in-process inbox ceiling (%s; the databases group's back-to-back rounds: %s %%)",
			f(t.num("e2e_vs_inbox_ceiling_pct"), 1), t.get("e2e_080_ceiling"), f(t.num("e2e_vs_inbox_interleaved_pct"), 1))
	}
	if t.has("router_cpu_32us") {
		rss += fmt.Sprintf("; router binary **%s µs** CPU per order at its peak (%s)", f(t.num("router_cpu_us_per_order"), 0), t.get("router_cpu_32us"))
	}
	target := "e2e ≥ 10× peer; overhead ≤ 15 %; p99 ≤ 100 ms; relay ≥ 20× forwarder; router RSS ≤ 150 MB (≤ 300 MB stalled); incident's load ≥ 1,000 orders/s; PostgreSQL ≥ 70 % of MariaDB; e2e ≥ 80 % of the inbox ceiling; router ≤ 32 µs CPU per order"
	if t.has("router_cpu_20us") {
		rss += fmt.Sprintf("; the hot path's: router binary %s µs CPU per order at its peak (%s), all its processes %s µs (%s), idle %s ms CPU per second (%s; the broker %s ms/s more), p99 at 2,000/s offered to it %s ms (%s), relay vs forwarder %s× (%s), longest partition stall in a scale-out %s ms (%s)",
			f(t.num("router_cpu_us_per_order"), 0), t.get("router_cpu_20us"), f(t.num("all_cpu_us_per_order"), 0), t.get("all_cpu_60us"),
			f(t.num("idle_router_ms_per_s"), 1), t.get("idle_router_5ms"), f(t.num("idle_kafka_added_ms_per_s"), 1),
			f(t.num("router_p99_ms_at_2000"), 1), t.get("router_p99_2000_30ms"), f(t.num("relay_vs_forwarder"), 1), t.get("relay_50x_forwarder"),
			f(t.num("scaleout_max_stall_ms"), 0), t.get("scaleout_stall_2s"))
		if t.has("router_vs_lean_cpu") && t.num("router_vs_lean_cpu") > 0 {
			rss += fmt.Sprintf("; the lean pipeline on the same input: %s µs CPU per order its process, %s in all (the router %s× and %s×)",
				f(t.num("lean_cpu_us_per_order"), 1), f(t.num("lean_all_cpu_us_per_order"), 0), f(t.num("router_vs_lean_cpu"), 1), f(t.num("all_vs_lean_all_cpu"), 1))
		}
		if t.has("lean_p99_ms_at_2000") && t.num("lean_p99_ms_at_2000") > 0 {
			rss += fmt.Sprintf("; its p99 at 2,000/s %s ms (the router %s×)", f(t.num("lean_p99_ms_at_2000"), 1), f(t.num("router_vs_lean_p99"), 1))
		}
		target += "; the hot path's: router ≤ 20 µs and all processes ≤ 60 µs CPU per order at its peak, idle ≤ 5 ms CPU per second, p99 ≤ 30 ms at 2,000/s, relay ≥ 50× forwarder, no partition stalled > 2 s in a scale-out"
	}
	row("`targets`: computed from this run's own figures",
		fmt.Sprintf("e2e vs peer **%s×** (%s); inbox overhead %s %% (rounds %s; %s); p99 at 30 %% of the run's peak %s ms (%s), at 2,000/s %s ms (%s); relay vs forwarder **%s×** (%s); bench process peak RSS %s MB%s",
			f(t.num("e2e_vs_peer"), 1), t.get("e2e_vs_peer_10x"), f(t.num("inbox_overhead_pct"), 1), t.get("overhead_spread"), t.get("inbox_overhead_15pct"),
			f(t.num("p99_ms_at_30pct_peak"), 1), t.get("p99_30pct_peak_100ms"), f(t.num("p99_ms_at_2000"), 1), t.get("p99_2000_100ms"),
			f(t.num("relay_vs_forwarder"), 1), t.get("relay_20x_forwarder"), f(t.num("bench_max_rss_mb"), 0), rss),
		target)
}

// twice is the share of a run's orders delivered twice (-dup-pct), from its orders and
// deliveries: "30 %".
func twice(r record) string {
	o := r.num("orders")
	if o <= 0 {
		return "—"
	}
	return f(100*(r.num("deliveries")-o)/o, 0) + " %"
}

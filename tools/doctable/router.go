package main

import "fmt"

// routerRows are the router binary's runs as a child process (tools/bench/router.go), when the
// run measured them: its peak resident memory and its own CPU per order, at its peak rate
// and at an offered load.
func (b benchRun) routerRows(row func(m, r, t string)) {
	cpu := func(r record) string {
		return fmt.Sprintf("router %s µs CPU per order (MariaDB %s, Kafka %s; %s in all)", f(r.num("router_cpu_us_per_order"), 0),
			f(r.num("db_cpu_us_per_order"), 0), f(r.num("kafka_cpu_us_per_order"), 0), f(r.num("total_cpu_us_per_order"), 0))
	}
	rss := func(r record) string {
		return fmt.Sprintf("≤ 150 MB: %s", verdict(r.num("max_rss_mb") <= 150))
	}
	if r, ok := b.one("router", "mode", "peak"); ok {
		row(fmt.Sprintf("`router` `peak`: `bin/router run` as a child process, %s orders pre-loaded (%s deliveries, %s twice), default settings",
			f(r.num("orders"), 0), f(r.num("deliveries"), 0), twice(r)),
			fmt.Sprintf("%s orders/s (steady %s); peak RSS **%s MB**; %s", rate(r.num("orders_per_s")), rate(r.num("steady_orders_per_s")),
				f(r.num("max_rss_mb"), 1), cpu(r)), rss(r))
	}
	if r, ok := b.one("router", "mode", "stalled"); ok {
		row(fmt.Sprintf("`router` `stalled`: %s records of %s MB and %s orders while a transaction holds the inbox for %s s",
			f(r.num("big_records"), 0), f(r.num("big_bytes")/1e6, 2), f(r.num("orders"), 0), f(r.num("stall_s"), 0)),
			fmt.Sprintf("peak RSS **%s MB**; %s quarantined, %s granted, %s s after the database came back", f(r.num("max_rss_mb"), 1),
				f(r.num("quarantined"), 0), f(r.num("granted"), 0), f(r.num("recovered_s"), 1)),
			fmt.Sprintf("≤ 300 MB, all quarantined: %s", verdict(r.num("max_rss_mb") <= 300 && r.num("quarantined") == r.num("big_records"))))
	}
	if r, ok := b.one("router", "mode", "stalled_payloads"); ok {
		row(fmt.Sprintf("`router` `stalled_payloads`: %s orders of %s MB (under `inbox.max_payload_bytes`, so they wait whole) on %s partitions while a transaction holds the inbox for %s s",
			f(r.num("payloads"), 0), f(r.num("payload_bytes")/1e6, 2), f(r.num("partitions"), 0), f(r.num("stall_s"), 0)),
			fmt.Sprintf("peak RSS %s MB after %s s, %s MB at the end of the stall, **%s MB** in all (processing); %s granted, %s s after the database came back",
				f(r.num("max_rss_first_mb"), 1), f(r.num("first_s"), 0), f(r.num("max_rss_stalled_mb"), 1), f(r.num("max_rss_mb"), 1),
				f(r.num("granted"), 0), f(r.num("recovered_s"), 1)),
			fmt.Sprintf("≤ 300 MB, all granted: %s", verdict(r.num("max_rss_mb") <= 300 && r.num("granted") == r.num("payloads"))))
	}
	if r, ok := b.one("lean", "kills", "0"); ok {
		line := fmt.Sprintf("%s orders/s; peak RSS %s MB; its process %s µs CPU per order (MariaDB %s, Kafka %s; **%s in all**)",
			rate(r.num("orders_per_s")), f(r.num("max_rss_mb"), 1), f(r.num("lean_cpu_us_per_order"), 1), f(r.num("db_cpu_us_per_order"), 0),
			f(r.num("kafka_cpu_us_per_order"), 0), f(r.num("total_cpu_us_per_order"), 0))
		if p, ok := b.one("router", "mode", "peak"); ok && r.num("lean_cpu_us_per_order") > 0 && r.num("total_cpu_us_per_order") > 0 {
			line += fmt.Sprintf("; the router's peak run **%s×** its process's CPU per order, %s× in all", f(p.num("router_cpu_us_per_order")/r.num("lean_cpu_us_per_order"), 1),
				f(p.num("total_cpu_us_per_order")/r.num("total_cpu_us_per_order"), 1))
		}
		row(fmt.Sprintf("`lean`: the batch-native floor on the peak run's input (%s orders, %s deliveries), a process of its own: per poll of up to %s records one database transaction (claim, the coupon plugin's `HandleBatch`) and one Kafka transaction with the events and the offsets",
			f(r.num("orders"), 0), f(r.num("deliveries"), 0), f(r.num("batch"), 0)), line, "—")
	}
	for _, r := range b.find("lean", "offered_per_s", "") {
		row(fmt.Sprintf("`lean` `%s`: the same pipeline at %s orders/s offered, %s s measured, as the router's line below", r.get("mode"), f(r.num("offered_per_s"), 0), r.get("seconds")),
			fmt.Sprintf("%s orders/s, p50 %s ms, p99 **%s ms**; peak RSS %s MB; its process %s µs CPU per order (MariaDB %s, Kafka %s; %s in all)",
				rate(r.num("orders_per_s")), f(r.num("p50_ms"), 1), f(r.num("p99_ms"), 1), f(r.num("max_rss_mb"), 1), f(r.num("lean_cpu_us_per_order"), 0),
				f(r.num("db_cpu_us_per_order"), 0), f(r.num("kafka_cpu_us_per_order"), 0), f(r.num("total_cpu_us_per_order"), 0)), "—")
	}
	for _, r := range b.find("router", "offered_per_s", "") {
		row(fmt.Sprintf("`router` `%s`: the same binary at %s orders/s offered, %s s measured", r.get("mode"), f(r.num("offered_per_s"), 0), r.get("seconds")),
			fmt.Sprintf("%s orders/s, p50 %s ms, p99 %s ms; peak RSS **%s MB**; %s", rate(r.num("orders_per_s")), f(r.num("p50_ms"), 1),
				f(r.num("p99_ms"), 1), f(r.num("max_rss_mb"), 1), cpu(r)), rss(r))
	}
}

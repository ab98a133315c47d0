package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// chaosRun is what the output of one `make chaos` run says: the CHAOS line and the lines
// of the harness and the checker before it.
type chaosRun struct {
	line   string            // the CHAOS line, verbatim
	ok     bool              // CHAOS ok
	fields map[string]string // key=value of the CHAOS line, the "faults over" line and the checker's lines
	text   map[string]string // other lines worth quoting, by what they are
}

var (
	kvRE      = regexp.MustCompile(`([a-z_]+)[=≈]([^\s,;()]+)`)
	logPrefix = regexp.MustCompile(`^chaos: \[\s*[0-9.]+s\] `)
)

// parseChaosLog reads the output of make chaos (scripts/chaos.sh tees it to
// .run/chaos/chaos.log). Only the last CHAOS line counts; the lines before it fill in.
func parseChaosLog(out string) (chaosRun, error) {
	c := chaosRun{fields: map[string]string{}, text: map[string]string{}}
	kv := func(s string) {
		for _, m := range kvRE.FindAllStringSubmatch(s, -1) {
			c.fields[m[1]] = m[2]
		}
	}
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimRight(l, "\r")
		msg := logPrefix.ReplaceAllString(l, "")
		switch {
		case strings.HasPrefix(l, "CHAOS "):
			c.line = l
		case strings.HasPrefix(l, "chaos: router built from "):
			c.text["build"] = strings.TrimPrefix(l, "chaos: router built from ")
		case strings.HasPrefix(l, "chaos: runtime "):
			c.text["runtime"] = strings.TrimSuffix(strings.Fields(strings.TrimPrefix(l, "chaos: runtime "))[0], "s")
		case msg != l && strings.HasPrefix(msg, "profile "):
			if f := strings.Fields(msg); len(f) >= 4 {
				c.text["profile"], c.text["seed"] = f[1], f[3]
			}
		case msg != l && strings.HasPrefix(msg, "faults over: "):
			s, _, _ := strings.Cut(strings.TrimPrefix(msg, "faults over: "), ";")
			kv(s)
		case msg != l && strings.HasPrefix(msg, "cluster faults: "):
			kv(strings.TrimPrefix(msg, "cluster faults: "))
		case msg != l && strings.HasPrefix(msg, "router RSS: "):
			c.text["rss"] = strings.TrimPrefix(msg, "router RSS: ")
		case msg != l && strings.HasPrefix(msg, "network faults: "):
			c.text["network"] = strings.TrimPrefix(msg, "network faults: ")
		case msg != l && strings.HasPrefix(msg, "checker: "):
			body := strings.TrimPrefix(msg, "checker: ")
			switch {
			case strings.HasPrefix(body, "poison records"):
				c.text["poison"] = body
			case strings.Contains(body, "outcomes as planned"):
				_, after, _ := strings.Cut(body, "outcomes as planned: ")
				c.text["misbehaver"] = after
			case strings.HasPrefix(body, "committed lag"):
				c.text["lag"] = strings.TrimPrefix(body, "committed lag ")
			default:
				kv(body)
			}
		}
	}
	if c.line == "" {
		return c, errors.New("no CHAOS line: not the output of a finished make chaos run")
	}
	if _, ok := c.fields["granted"]; !ok {
		return c, errors.New("the checker reported nothing (the harness failed before it ran): " + c.line)
	}
	c.ok = strings.HasPrefix(c.line, "CHAOS ok")
	head, _, _ := strings.Cut(c.line, " violations: ")
	kv(head)
	return c, nil
}

// region is the region of docs/RELIABILITY.md the run's table goes to: chaos-table for the
// one-broker profiles, chaos-cluster-table and soak-table for the cluster's,
// chaos-galera-table for the Galera cluster's.
func (c chaosRun) region() string {
	switch c.text["profile"] {
	case "galera":
		return "chaos-galera-table"
	case "cluster":
		return "chaos-cluster-table"
	case "soak":
		return "soak-table"
	}
	return "chaos-table"
}

// table is the run's table (region) of docs/RELIABILITY.md.
func (c chaosRun) table() string {
	var w strings.Builder
	get := func(k string) string {
		if v, ok := c.fields[k]; ok {
			return v
		}
		return "—"
	}
	txt := func(k string) string {
		if v, ok := c.text[k]; ok {
			return v
		}
		return "—"
	}
	fmt.Fprintf(&w, "Profile `%s`, seed %s, router built from %s; %s s.\n\n", txt("profile"), txt("seed"), txt("build"), txt("runtime"))
	w.WriteString("| what | figure |\n|---|---|\n")
	row := func(k, v string) { fmt.Fprintf(&w, "| %s | %s |\n", k, v) }
	row("outcome", "**"+strings.Fields(c.line)[1]+"**")
	row("orders", fmt.Sprintf("%s (%s order-paid deliveries of the run on Kafka)", get("orders"), get("deliveries")))
	if _, cluster := c.fields["coordinator_kills"]; cluster {
		row("router SIGKILLs", get("router_kills"))
		row("broker SIGKILLs (three-broker cluster)", fmt.Sprintf("%s: leader of most order-paid partitions %s, of coupon-granted %s, transaction coordinator of a relay shard %s; %s while the outbox had unpublished rows (mid-transaction)",
			get("broker_kills"), get("order_paid_leader_kills"), get("coupon_granted_leader_kills"), get("coordinator_kills"), get("mid_transaction_kills")))
		row("controlled broker restarts / database restarts", get("node_restarts")+" / "+get("db_restarts"))
		if c.text["profile"] == "soak" {
			row("rebalances (a router joining or leaving)", get("rebalances"))
			row("routers' RSS (sampled every 10 s)", txt("rss"))
		}
	} else {
		row("SIGKILLs", get("kills"))
	}
	if k, galera := c.fields["db_node_kills"]; galera && k != "0" {
		row("SIGKILLs of the Galera node the routers wrote to (each rejoined and Synced before the next)", get("db_node_kills"))
		row("orders/s fault-free, Galera cluster / single node", get("orders_per_s_galera")+" / "+get("orders_per_s_single"))
	}
	row("relay crashes between the Kafka commit and the database mark", get("relay_crashes")+" (crashed / faults)")
	if _, cluster := c.fields["coordinator_kills"]; !cluster {
		row("broker restarts / database restarts", get("broker_restarts")+" / "+get("db_restarts"))
	}
	row("router exits on their own (restarted)", get("unplanned_router_exits"))
	row("network faults", txt("network"))
	row("granted / failed / quarantined", fmt.Sprintf("%s / %s / %s", get("granted"), get("failed"), get("quarantined")))
	row("lost", "**"+get("lost")+"**")
	row("duplicate coupons / duplicate events (read_committed)", fmt.Sprintf("**%s** / **%s** (%s distinct CouponGranted event ids)",
		get("duplicate_coupons"), get("duplicate_events"), get("grant_events")))
	row("duplicates blocked by the inbox (redeliveries among them)", fmt.Sprintf("%s (≈%s)", get("duplicates_blocked"), get("redeliveries")))
	row("messages acked past a committed offset, not handed out again after a restart or a rebalance", get("acked_skipped"))
	row("poison", txt("poison"))
	row("misbehaving plugin, against its plan", txt("misbehaver"))
	row("transitions logged", get("transitions"))
	row("committed lag", txt("lag"))
	fmt.Fprintf(&w, "\n```\n%s\n```\n", c.line)
	return w.String()
}

package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// record is one BENCH line: its name and its fields in the order reported.
type record struct {
	name   string
	keys   []string
	values map[string]string
}

func (r record) has(k string) bool   { _, ok := r.values[k]; return ok }
func (r record) get(k string) string { return r.values[k] }

// num is the field as a number (NaN when it is missing or not one).
func (r record) num(k string) float64 {
	f, err := strconv.ParseFloat(r.values[k], 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// parseBenchCSV reads the CSV of make bench (header name,key,value; one row per field of each
// BENCH line, the lines one after another). A row starts a new line when its name differs
// from the line's or its key is already in it: no BENCH line repeats a key, and two lines of
// one name always share their first key (round, mode, when, ...).
func parseBenchCSV(rd io.Reader) ([]record, error) {
	rows, err := csv.NewReader(rd).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 || strings.Join(rows[0], ",") != "name,key,value" {
		return nil, errors.New("not a bench CSV: the header must be name,key,value")
	}
	var recs []record
	for _, row := range rows[1:] {
		if len(row) != 3 {
			return nil, fmt.Errorf("row %q: want name,key,value", row)
		}
		name, key, value := row[0], row[1], row[2]
		if n := len(recs); n == 0 || recs[n-1].name != name || recs[n-1].has(key) {
			recs = append(recs, record{name: name, values: map[string]string{}})
		}
		r := &recs[len(recs)-1]
		r.keys = append(r.keys, key)
		r.values[key] = value
	}
	return recs, nil
}

// benchRun is one run's records and where they came from.
type benchRun struct {
	source string
	recs   []record
}

// find returns the lines of name whose fields equal want ("" matches any value, "-" a
// missing field; a line with a round is per-round unless want names round).
func (b benchRun) find(name string, want ...string) []record {
	var out []record
next:
	for _, r := range b.recs {
		if r.name != name {
			continue
		}
		perRound := true
		for i := 0; i+1 < len(want); i += 2 {
			k, v := want[i], want[i+1]
			if k == "round" {
				perRound = false
			}
			switch {
			case v == "-" && r.has(k), v != "-" && !r.has(k), v != "" && v != "-" && r.get(k) != v:
				continue next
			}
		}
		if perRound && r.has("round") {
			continue
		}
		out = append(out, r)
	}
	return out
}

// one is the single median (round-less) line of name matching want, or a zero record.
func (b benchRun) one(name string, want ...string) (record, bool) {
	rs := b.find(name, want...)
	if len(rs) == 0 {
		return record{values: map[string]string{}}, false
	}
	return rs[len(rs)-1], true
}

// calibration is the calibration line's work_ms at when (start, before_e2e, end).
func (b benchRun) calibration(when string) string {
	r, ok := b.one("calibration", "when", when)
	if !ok {
		return "—"
	}
	return r.get("work_ms")
}

// spread is the min–max over the per-round lines of name matching want, of key.
func (b benchRun) spread(key, name string, want ...string) string {
	return b.spreadN(0, key, name, want...)
}

// spreadN is spread with the given decimals.
func (b benchRun) spreadN(decimals int, key, name string, want ...string) string {
	var xs []float64
	for _, r := range b.find(name, append([]string{"round", ""}, want...)...) {
		if v := r.num(key); !math.IsNaN(v) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return "—"
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	if f(lo, decimals) == f(hi, decimals) {
		return f(lo, decimals)
	}
	return f(lo, decimals) + "–" + f(hi, decimals)
}

// f formats a number with thousands separators and the given decimals ("—" if missing).
func f(v float64, decimals int) string {
	if math.IsNaN(v) {
		return "—"
	}
	s := strconv.FormatFloat(math.Abs(v), 'f', decimals, 64)
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	if v < 0 {
		return "−" + b.String()
	}
	return b.String()
}

// rate formats a throughput: no decimals from 100 up.
func rate(v float64) string {
	if !math.IsNaN(v) && v < 100 {
		return f(v, 1)
	}
	return f(v, 0)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

// table is the bench-table region of docs/BENCHMARKS.md: one row per measurement, median
// lines only (min–max over the rounds where the run has them).
func (b benchRun) table() (string, error) {
	e2e, ok := b.one("e2e", "mode", "batch", "offered", "preloaded", "rounds", "")
	if !ok {
		return "", errors.New("no median e2e line (mode=batch, preloaded): not a full run of make bench")
	}
	ib, ok := b.one("inbox", "mode", "batch", "rounds", "")
	if !ok {
		return "", errors.New("no median inbox line (mode=batch): not a full run of make bench")
	}
	var w strings.Builder
	fmt.Fprintf(&w, "Run `%s` (its CSV: `tools/bench/results/latest.csv`); calibration (`work_ms`, the same fixed piece of CPU work) **%s ms at the start, %s before the e2e runs, %s at the end**.\n\n",
		b.source, b.calibration("start"), b.calibration("before_e2e"), b.calibration("end"))
	w.WriteString("| measurement | result | target |\n|---|---|---|\n")
	row := func(m, r, t string) { fmt.Fprintf(&w, "| %s | %s | %s |\n", m, r, t) }

	tput := e2e.num("orders_per_s")
	row(fmt.Sprintf("`e2e` group commit, %s rounds: order-paid in → CouponGranted visible (read_committed)", e2e.get("rounds")),
		fmt.Sprintf("**%s orders/s** (rounds %s–%s); steady %s (%s–%s)", rate(tput), rate(e2e.num("min")), rate(e2e.num("max")),
			rate(e2e.num("steady_orders_per_s")), rate(e2e.num("steady_min")), rate(e2e.num("steady_max"))),
		"≥ 10,000 orders/s: "+verdict(tput >= 10000))
	row("`e2e_cpu` at full load: CPU µs per order (rounds' range)",
		fmt.Sprintf("%s in all: MariaDB %s, Kafka %s, bench process %s", b.spread("total_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "-"),
			b.spread("db_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "-"),
			b.spread("kafka_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "-"),
			b.spread("bench_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "-")), "—")
	var loads []string
	p99at2000 := math.NaN()
	for _, l := range b.find("e2e", "mode", "batch", "offered_per_s", "", "rounds", "") {
		load := l.get("offered_per_s")
		loads = append(loads, fmt.Sprintf("%s/s: p50 %s, p99 **%s** (%s–%s)", f(l.num("offered_per_s"), 0), f(l.num("p50_ms"), 1),
			f(l.num("p99_ms"), 1), f(l.num("p99_min"), 1), f(l.num("p99_max"), 1)))
		if load == "2000" {
			p99at2000 = l.num("p99_ms")
		}
	}
	if len(loads) > 0 {
		t := "—"
		if !math.IsNaN(p99at2000) {
			t = "p99 ≤ 100 ms at 2,000/s: " + verdict(p99at2000 <= 100)
		}
		row("`e2e` latency, ms, at offered loads (median of the rounds; p99's range)", strings.Join(loads, "; "), t)
	}
	if _, ok := b.one("e2e_cpu", "round", "", "mode", "batch", "offered_per_s", "2000"); ok {
		row("`e2e_cpu` at 2,000 orders/s: CPU µs per order (rounds' range)",
			fmt.Sprintf("%s in all: MariaDB %s, Kafka %s, bench process %s", b.spread("total_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "2000"),
				b.spread("db_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "2000"),
				b.spread("kafka_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "2000"),
				b.spread("bench_cpu_us_per_order", "e2e_cpu", "mode", "batch", "offered_per_s", "2000")), "—")
	}
	if _, ok := b.one("e2e_batches", "round", ""); ok {
		row("`e2e_batches`: deliveries per batch transaction (rounds' range)", b.spreadN(1, "avg_batch", "e2e_batches")+
			fmt.Sprintf("; fallbacks %s, rollbacks %s", b.spread("fallbacks", "e2e_batches"), b.spread("rollbacks", "e2e_batches"))+
			handoffBatches(b), "—")
	}
	if u, ok := b.one("unsafe", "mode", "handler_only", "rounds", ""); ok {
		row("`unsafe` `handler_only`: the coupon batch alone on pre-built batches (a ceiling)",
			fmt.Sprintf("%s orders/s (%s–%s)", rate(u.num("orders_per_s")), rate(u.num("min")), rate(u.num("max"))), "—")
	}
	if u, ok := b.one("unsafe", "mode", "batch", "rounds", ""); ok {
		row("`unsafe` `batch`: the overhead baseline, the Batcher's path without the inbox",
			fmt.Sprintf("%s orders/s (%s–%s)", rate(u.num("orders_per_s")), rate(u.num("min")), rate(u.num("max"))), "—")
	}
	oh := ib.num("overhead_pct_vs_unsafe")
	row(fmt.Sprintf("`inbox` `batch`: group commit with the inbox, %s rounds; overhead vs the baseline", ib.get("rounds")),
		fmt.Sprintf("%s orders/s (%s–%s); overhead median **%s %%** (rounds %s–%s), pooled **%s %%**, by CPU per order **%s %%**",
			rate(ib.num("orders_per_s")), rate(ib.num("min")), rate(ib.num("max")), f(oh, 1), f(ib.num("overhead_min"), 1),
			f(ib.num("overhead_max"), 1), f(ib.num("overhead_pooled_pct"), 1), f(ib.num("overhead_cpu_pct"), 1)),
		"≤ 15 % by each of the three: "+verdict(oh <= 15 && ib.num("overhead_pooled_pct") <= 15 && ib.num("overhead_cpu_pct") <= 15))
	var single []string
	for _, spt := range []string{"1", "3"} {
		u, uok := b.one("unsafe", "steps_per_tx", spt)
		i, iok := b.one("inbox", "steps_per_tx", spt)
		if uok && iok {
			single = append(single, fmt.Sprintf("%s: unsafe %s, inbox %s orders/s (overhead %s %%)", spt,
				rate(u.num("orders_per_s")), rate(i.num("orders_per_s")), f(i.num("overhead_pct_vs_unsafe"), 1)))
		}
	}
	if len(single) > 0 {
		row("one delivery per transaction, handler steps per transaction 1 / 3 (`unsafe` / `inbox` `steps_per_tx`)", strings.Join(single, "; "), "—")
	}
	if n, ok := b.one("naive", "orders_per_s", ""); ok {
		row("`naive`: SELECT-then-INSERT, each order delivered twice at once",
			fmt.Sprintf("%s orders/s, **%s duplicates** in %s deliveries", rate(n.num("orders_per_s")), f(n.num("duplicates"), 0), f(n.num("deliveries"), 0)), "—")
	}
	if s, ok := b.one("storm", "orders", ""); ok {
		row(fmt.Sprintf("`storm`: %s orders × %s concurrent deliveries", f(s.num("orders"), 0), s.get("deliveries_each")),
			fmt.Sprintf("%s s; %s coupons, %s duplicate coupons, %s duplicates blocked", s.get("seconds"), f(s.num("coupons"), 0),
				f(s.num("duplicate_coupons"), 0), f(s.num("duplicates_blocked"), 0)), "0 duplicate coupons: "+verdict(s.num("duplicate_coupons") == 0))
	}
	var relays []string
	eos := math.NaN()
	for _, r := range b.find("relay", "mode", "") {
		line := fmt.Sprintf("%s %s", strings.ReplaceAll(r.get("mode"), "_", " "), rate(r.num("events_per_s")))
		if r.has("total_cpu_us_per_event") {
			line += fmt.Sprintf(" (%s µs CPU per event: MariaDB %s, Kafka %s, the relay's process %s)", f(r.num("total_cpu_us_per_event"), 1),
				f(r.num("db_cpu_us_per_event"), 1), f(r.num("kafka_cpu_us_per_event"), 1), f(r.num("bench_cpu_us_per_event"), 1))
		}
		relays = append(relays, line)
		if r.get("mode") == "exactly_once" {
			eos = r.num("events_per_s")
		}
	}
	if len(relays) > 0 {
		row("`relay`: outbox → Kafka, events/s", strings.Join(relays, "; "), "exactly once ≥ 25,000 events/s: "+verdict(eos >= 25000))
	}
	if wf, ok := b.one("watermill_forwarder", "events_per_s", ""); ok {
		row("`watermill_forwarder`: Watermill's forwarder (watermill-sql MySQL subscriber → watermill-kafka)",
			fmt.Sprintf("%s events/s", rate(wf.num("events_per_s"))), "—")
	}
	b.relayDBRow(row)
	b.rowsRow(row)
	b.kclientRow(row)
	if s, ok := b.one("e2e", "mode", "single", "offered", "preloaded"); ok {
		var lat []string
		for _, l := range b.find("e2e", "mode", "single", "offered_per_s", "") {
			lat = append(lat, fmt.Sprintf("%s/s p99 %s ms", f(l.num("offered_per_s"), 0), f(l.num("p99_ms"), 1)))
		}
		row("`e2e` `single`: one-at-a-time subscriber, one delivery per transaction (`kafka.window` 1, `inbox.batch_size` 1)", fmt.Sprintf("%s orders/s; %s", rate(s.num("orders_per_s")), strings.Join(lat, ", ")), "—")
	}
	b.tracingRow(row)
	b.plainRows(row)
	b.seedRows(row)
	b.peerRows(row)
	b.routerRows(row)
	b.databasesRow(row)
	b.targetsRow(row)
	return w.String(), nil
}

// relayDBRow is the relay's database work per event without Kafka, when the run measured it:
// marking rows published (and sweeping them after the retention) against deleting them.
func (b benchRun) relayDBRow(row func(m, r, t string)) {
	_, ok := b.one("ratio", "mode", "relay_db_delete_vs_mark")
	if !ok {
		return
	}
	mark, _ := b.one("relay_db", "mode", "mark")
	del, _ := b.one("relay_db", "mode", "delete")
	sel, _ := b.one("relay_db", "mode", "select_only")
	row(fmt.Sprintf("`relay_db`: the relay's database work without Kafka, %s events in reads of %s, %s rounds: MariaDB CPU µs per event (medians; rounds' range)",
		f(mark.num("events"), 0), f(mark.num("batch"), 0), mark.get("rounds")),
		fmt.Sprintf("read and mark %s (%s–%s); the retention sweep of the same rows %s more (run at once here, by the cleaner after `relay.retention`); read and delete by position %s (%s–%s); the read alone %s (%s–%s). Deleting instead of marking: **%+.1f µs per event** while publishing, the sweep's %s µs later saved",
			f(mark.num("db_cpu_us_per_event"), 1), f(mark.num("db_cpu_min"), 1), f(mark.num("db_cpu_max"), 1), f(mark.num("sweep_db_cpu_us_per_event"), 1),
			f(del.num("db_cpu_us_per_event"), 1), f(del.num("db_cpu_min"), 1), f(del.num("db_cpu_max"), 1),
			f(sel.num("db_cpu_us_per_event"), 1), f(sel.num("db_cpu_min"), 1), f(sel.num("db_cpu_max"), 1),
			del.num("db_cpu_us_per_event")-mark.num("db_cpu_us_per_event"), f(mark.num("sweep_db_cpu_us_per_event"), 1)), "—")
}

// rowsRow is the coupon plugin's rows per order, table by table, when the run measured it.
func (b benchRun) rowsRow(row func(m, r, t string)) {
	ratio, ok := b.one("ratio", "mode", "rows_log")
	if !ok {
		return
	}
	var parts []string
	for _, m := range []struct{ mode, label string }{{"grant", "grant"}, {"log3", "transition log, 3 rows"}, {"log1", "transition log, 1 row"}, {"coupon", "coupon"}} {
		r, ok := b.one("rows", "mode", m.mode)
		if !ok {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s (%s–%s)", m.label, f(r.num("db_cpu_us_per_order"), 1), f(r.num("db_cpu_min"), 1), f(r.num("db_cpu_max"), 1)))
	}
	g, _ := b.one("rows", "mode", "log3")
	row(fmt.Sprintf("`rows`: the coupon plugin's rows per order, one table at a time, %s orders, %s rounds: MariaDB CPU µs per order (medians; rounds' range)",
		f(g.num("orders"), 0), g.get("rounds")),
		fmt.Sprintf("%s; one log row instead of three saves **%s µs per order**", strings.Join(parts, "; "), f(ratio.num("log1_saving_db_cpu_us_per_order"), 1)), "—")
	in, ok := b.one("ratio", "mode", "rows_inbox")
	if !ok {
		return
	}
	parts = parts[:0]
	for _, m := range []struct{ mode, label string }{{"inbox", "a new row"}, {"inbox_dup", "the same claim meeting the row (a copy)"},
		{"inbox_noindex", "a new row without the secondary index"}, {"inbox_key", "a row of only the unique key"}} {
		if r, ok := b.one("rows", "mode", m.mode); ok {
			parts = append(parts, fmt.Sprintf("%s %s (%s–%s)", m.label, f(r.num("db_cpu_us_per_order"), 1), f(r.num("db_cpu_min"), 1), f(r.num("db_cpu_max"), 1)))
		}
	}
	row(fmt.Sprintf("`rows` `inbox*`: the inbox's row as the batch claims it, %s rows, %s rounds: MariaDB CPU µs per row (medians; rounds' range)",
		f(g.num("orders"), 0), g.get("rounds")),
		fmt.Sprintf("%s; of a new row: the key **%s**, the secondary index %s, the other columns (message id, source, payload, metadata, fingerprint, status, expiry) %s",
			strings.Join(parts, "; "), f(in.num("key_db_cpu_us"), 1), f(in.num("index_db_cpu_us"), 1), f(in.num("columns_db_cpu_us"), 1)), "—")
}

// kclientRow is the Kafka client alone, Sarama against kgo, when the run measured it: CPU per
// record consuming and producing transactionally, both in one loop with the offsets in the
// transaction where the run has it, consuming through the router's path where the run has it, and what kgo could save the router per order at most, beside the router's
// own CPU per order at its peak when the run has it.
func (b benchRun) kclientRow(row func(m, r, t string)) {
	ratio, ok := b.one("ratio", "mode", "kgo_vs_sarama")
	if !ok {
		return
	}
	var res []string
	for _, op := range []struct{ op, label, pct string }{{"consume", "consume", "consume_cpu_pct"}, {"produce", "transactional produce", "produce_cpu_pct"}} {
		s, _ := b.one("kclient", "client", "sarama", "op", op.op)
		k, _ := b.one("kclient", "client", "kgo", "op", op.op)
		res = append(res, fmt.Sprintf("%s: Sarama %s (%s records/s), kgo %s (%s records/s), kgo **%s %%** of Sarama's", op.label,
			f(s.num("cpu_us_per_record"), 2), rate(s.num("records_per_s")), f(k.num("cpu_us_per_record"), 2), rate(k.num("records_per_s")),
			f(ratio.num(op.pct), 1)))
	}
	if sl, ok := b.one("kclient", "client", "sarama", "op", "loop"); ok {
		kl, _ := b.one("kclient", "client", "kgo", "op", "loop")
		res = append(res, fmt.Sprintf("a batch's events and its offsets in one transaction (`loop`, up to %s records each): Sarama %s (%s records/s), kgo %s (%s records/s), kgo **%s %%** of Sarama's, %s µs per order less; the broker %s and %s",
			f(sl.num("max_records_per_txn"), 0), f(sl.num("cpu_us_per_record"), 2), rate(sl.num("records_per_s")), f(kl.num("cpu_us_per_record"), 2),
			rate(kl.num("records_per_s")), f(ratio.num("loop_cpu_pct"), 1), f(ratio.num("loop_saving_us_per_order"), 2),
			f(sl.num("kafka_cpu_us_per_record"), 1), f(kl.num("kafka_cpu_us_per_record"), 1)))
	}
	if rt, ok := b.one("kclient", "client", "router", "op", "consume"); ok {
		glue := fmt.Sprintf("Sarama under the router's consuming path (kafkax's window and consumer loop, no database): %s with a handler returning at once",
			f(rt.num("cpu_us_per_record"), 2))
		if rw, ok := b.one("kclient", "client", "router_wait", "op", "consume"); ok {
			glue += fmt.Sprintf(", %s with handlers parked until their batch of 512 is released (the window full, as at the router's peak)", f(rw.num("cpu_us_per_record"), 2))
		}
		res = append(res, glue)
	}
	bound := ratio.num("router_saving_us_per_order_bound")
	saving, target := fmt.Sprintf("router saving bound **%s µs per order**", f(bound, 2)), "—"
	if r, ok := b.one("router", "mode", "peak"); ok && r.num("router_cpu_us_per_order") > 0 {
		pct := 100 * bound / r.num("router_cpu_us_per_order")
		saving += fmt.Sprintf(" (%s %% of the router's %s µs at its peak)", f(pct, 1), f(r.num("router_cpu_us_per_order"), 0))
		target = "kgo only with ≥ 20 % less router CPU per order: **out of reach**"
		if pct >= 20 {
			target = "kgo only with ≥ 20 % less router CPU per order: within the bound"
		}
	}
	s, _ := b.one("kclient", "client", "sarama", "op", "produce")
	row(fmt.Sprintf("`kclient`: the Kafka client, Sarama vs franz-go (kgo), alone and under the router's consuming path, %s records, %s per transaction, %s rounds: CPU µs per record (medians)",
		f(s.num("records"), 0), f(s.num("records_per_txn"), 0), ratio.get("rounds")), strings.Join(append(res, saving), "; "), target)
}

// tracingRow is the e2e path with tracing off and on, when the run measured it.
func (b benchRun) tracingRow(row func(m, r, t string)) {
	off, ok := b.one("tracing", "mode", "off", "rounds", "")
	if !ok {
		return
	}
	res := []string{fmt.Sprintf("off %s orders/s (%s µs CPU per order)", rate(off.num("orders_per_s")), f(off.num("total_cpu_us_per_order"), 0))}
	for _, m := range []string{"on", "unsampled"} {
		if r, ok := b.one("tracing", "mode", m, "rounds", ""); ok {
			res = append(res, fmt.Sprintf("%s %s (overhead **%s %%**, by CPU per order %s %%; the pipeline's process %s µs more per order)", m,
				rate(r.num("orders_per_s")), f(r.num("overhead_pct"), 1), f(r.num("cpu_overhead_pct"), 1), f(r.num("bench_cpu_added_us_per_order"), 1)))
		}
	}
	row(fmt.Sprintf("`tracing`: the `e2e` path, tracing off / on (every trace sampled) / on, none sampled; %s rounds (medians)", off.get("rounds")),
		strings.Join(res, "; "), "—")
}

// plainRows are the plain handler's medians and ratios, when the run measured them.
func (b benchRun) plainRows(row func(m, r, t string)) {
	var modes []string
	for _, m := range []string{"single", "grouped", "grouped_inserter", "coupon_batch"} {
		if p, ok := b.one("plain", "mode", m, "rounds", ""); ok {
			modes = append(modes, fmt.Sprintf("%s %s orders/s (%s µs CPU per order)", strings.ReplaceAll(m, "_", " "),
				rate(p.num("orders_per_s")), f(p.num("total_cpu_us_per_order"), 0)))
		}
	}
	if len(modes) == 0 {
		return
	}
	row("`plain`: a one-step plain `inbox.Handler` (medians)", strings.Join(modes, "; "), "—")
	for _, r := range []struct{ how, vs string }{{"tx.ExecContext", "plain_grouped"}, {"inbox.Inserter", "plain_inserter"}} {
		if p, ok := b.one("ratio", r.vs+"_vs_single", ""); ok {
			single, batch := p.num(r.vs+"_vs_single"), p.num(r.vs+"_vs_coupon_batch")
			row("`ratio`: plain grouped (`"+r.how+"`) vs single; vs the coupon `BatchHandler`", fmt.Sprintf("%s×; %s", f(single, 2), f(batch, 2)),
				fmt.Sprintf("≥ 10×: %s; ≥ 0.5: %s", verdict(single >= 10), verdict(batch >= 0.5)))
		}
	}
}

// seedRows are the incident's own load and the write-up's consumer, when the run measured them.
func (b benchRun) seedRows(row func(m, r, t string)) {
	for _, s := range b.find("seed_load", "mode", "") {
		row(fmt.Sprintf("`seed_load` `%s`: the incident's unscaled calls (%s orders)", s.get("mode"), f(s.num("orders"), 0)),
			fmt.Sprintf("%s orders/s, %s %% of the run's bound (%s); %s rebalances, %s duplicate coupons; peak calls in flight %s, records in flight %s (window %s, budget %s MiB)",
				rate(s.num("orders_per_s")), f(s.num("pct_of_run_bound"), 0), rate(s.num("run_bound_orders_per_s")),
				f(s.num("rebalances"), 0), f(s.num("duplicate_coupons"), 0), f(s.num("peak_calls_in_flight"), 0),
				f(s.num("peak_records_in_flight"), 0), f(s.num("window"), 0), f(s.num("budget_mb"), 0)), "—")
	}
	for _, s := range b.find("seed_consumer", "records_per_poll", "") {
		row(fmt.Sprintf("`seed_consumer`: the write-up's consumer, %s records per poll (a model)", s.get("records_per_poll")),
			fmt.Sprintf("%s orders/s unscaled; %s rebalances; %s duplicate coupons of %s", s.get("orders_per_s_unscaled"),
				f(s.num("rebalances"), 0), f(s.num("duplicate_coupons"), 0), f(s.num("coupons"), 0)), "—")
	}
}

// summary is README's bench-summary region: the four headline figures and the run's
// calibration.
func (b benchRun) summary() string {
	e2e, _ := b.one("e2e", "mode", "batch", "offered", "preloaded", "rounds", "")
	ib, _ := b.one("inbox", "mode", "batch", "rounds", "")
	p99, _ := b.one("e2e", "mode", "batch", "offered_per_s", "2000", "rounds", "")
	eos, _ := b.one("relay", "mode", "exactly_once")
	var w strings.Builder
	fmt.Fprintf(&w, "| measurement | latest run (calibration %s / %s ms at start / end) | target |\n|---|---|---|\n",
		b.calibration("start"), b.calibration("end"))
	fmt.Fprintf(&w, "| end to end, exactly once (orders/s) | %s | ≥ 10,000 |\n", rate(e2e.num("orders_per_s")))
	fmt.Fprintf(&w, "| p99 latency at 2,000 orders/s | %s ms | ≤ 100 ms |\n", f(p99.num("p99_ms"), 1))
	fmt.Fprintf(&w, "| inbox overhead vs the same path without it | %s %% | ≤ 15 %% |\n", f(ib.num("overhead_pct_vs_unsafe"), 1))
	fmt.Fprintf(&w, "| relay, exactly once (events/s) | %s | ≥ 25,000 |\n", rate(eos.num("events_per_s")))
	return w.String()
}

// handoffBatches is the relay's batches of a round taken from the hand-off and read back
// (e2e_handoff), for the e2e_batches row; empty for a run without the line.
func handoffBatches(b benchRun) string {
	if _, ok := b.one("e2e_handoff", "round", ""); !ok {
		return ""
	}
	return fmt.Sprintf("; the relay's batches per round taken from the hand-off %s, read back %s",
		b.spread("handoff_batches", "e2e_handoff"), b.spread("readback_batches", "e2e_handoff"))
}

package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// latencies is the p50 and p99, in ms, of orders from..to: Kafka timestamp of the order on
// topic in → w saw its event. measured is how many orders had both.
func latencies(kc kafkax.Config, in string, w *watcher, prefix string, from, to int) (p50, p99 float64, measured int, err error) {
	ins, err := readTimestamps(kc, in)
	if err != nil {
		return 0, 0, 0, err
	}
	var ds []float64
	for i := from; i < to; i++ {
		id := order(prefix, i).OrderID
		a, ok1 := ins[id]
		b, ok2 := w.at(id)
		if ok1 && ok2 {
			ds = append(ds, float64(b.Sub(a).Microseconds())/1000)
		}
	}
	if len(ds) == 0 {
		return 0, 0, 0, fmt.Errorf("no latencies measured")
	}
	sort.Float64s(ds)
	return ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*99/100)], len(ds), nil
}

// readTimestamps returns the Kafka timestamp of each key's first committed record.
func readTimestamps(kc kafkax.Config, topic string) (map[string]time.Time, error) {
	recs, err := kc.ReadAll(context.Background(), topic, 2*time.Second)
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(recs))
	for _, r := range recs {
		if _, seen := out[string(r.Key)]; !seen {
			out[string(r.Key)] = r.Timestamp
		}
	}
	return out, nil
}

// stages splits the latency of orders from..to into where it was spent, from clocks on this
// host: the order's Kafka timestamp (this process's producer), the inbox row's created_at
// (the router's claim, MariaDB's clock), the outbox row's created_at (the handler wrote the
// event, same transaction) and the moment the live read_committed consumer saw the event.
// The rows' created_at is when the statement ran, before the transaction commits.
func (e *e2eRun) stages(ctx context.Context, in string, w *watcher, rate, from, to int) error {
	s, db := e.s, e.s.db
	ins, err := readTimestamps(s.kc, in)
	if err != nil {
		return err
	}
	created := func(q string) (map[string]time.Time, error) {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]time.Time{}
		for rows.Next() {
			var k string
			var t time.Time
			if err := rows.Scan(&k, &t); err != nil {
				return nil, err
			}
			out[k] = t
		}
		return out, rows.Err()
	}
	inbox, err := created("SELECT dedup_key, created_at FROM inbox WHERE dedup_key LIKE 'lat-%'")
	if err != nil {
		return err
	}
	outbox, err := created("SELECT msg_key, created_at FROM outbox WHERE msg_key LIKE 'lat-%'")
	if err != nil {
		return err
	}
	var produced, toInbox, toOutbox, toVisible []float64
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var dump *csv.Writer
	if s.cfg.latencyDump != "" {
		f, err := os.Create(fmt.Sprintf("%s-%d.csv", s.cfg.latencyDump, rate))
		if err != nil {
			return err
		}
		defer f.Close()
		dump = csv.NewWriter(f)
		defer dump.Flush()
		_ = dump.Write([]string{"order", "sent_ms", "produced_ms", "kafka_to_handler_ms", "kafka_to_inbox_ms", "inbox_to_outbox_ms", "outbox_to_visible_ms", "total_ms", "due_unix_ms"})
	}
	for i := from; i < to; i++ {
		id := order("lat", i).OrderID
		t0, ok0 := ins[id]
		t1, ok1 := inbox[id]
		t2, ok2 := outbox[id]
		t3, ok3 := w.at(id)
		if ok0 && ok1 && ok2 && ok3 {
			if v, ok := e.producedAt.Load(id); ok {
				produced = append(produced, ms(v.(time.Time).Sub(t0)))
			}
			toInbox = append(toInbox, ms(t1.Sub(t0)))
			toOutbox = append(toOutbox, ms(t2.Sub(t1)))
			toVisible = append(toVisible, ms(t3.Sub(t2)))
			if dump != nil {
				f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
				since := func(m *sync.Map) float64 {
					if v, ok := m.Load(id); ok {
						return ms(v.(time.Time).Sub(t0))
					}
					return -1
				}
				_ = dump.Write([]string{id, f(ms(t0.Sub(ins[order("lat", from).OrderID]))), f(since(&e.producedAt)), f(since(&e.handedAt)), f(ms(t1.Sub(t0))), f(ms(t2.Sub(t1))), f(ms(t3.Sub(t2))), f(ms(t3.Sub(t0))), strconv.FormatInt(t0.UnixMilli(), 10)})
			}
		}
	}
	if len(toInbox) == 0 {
		return fmt.Errorf("stages: no order found in every stage")
	}
	p := func(d []float64, q int) float64 {
		sort.Float64s(d)
		return d[min(len(d)-1, len(d)*q/100)]
	}
	if len(produced) == 0 {
		produced = []float64{-1}
	}
	// produce (the order due → the generator's request for it returned) is part of
	// kafka_to_inbox, which runs from the order's due time.
	s.report("e2e_stages", "offered_per_s", rate, "produce_p50_ms", p(produced, 50), "produce_p99_ms", p(produced, 99),
		"kafka_to_inbox_p50_ms", p(toInbox, 50), "kafka_to_inbox_p99_ms", p(toInbox, 99),
		"inbox_to_outbox_p50_ms", p(toOutbox, 50), "inbox_to_outbox_p99_ms", p(toOutbox, 99),
		"outbox_to_visible_p50_ms", p(toVisible, 50), "outbox_to_visible_p99_ms", p(toVisible, 99))
	return nil
}

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/internal/chaosplan"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
)

// synthRun is where a synthetic run's data is.
type synthRun struct {
	ledger string
	start  map[string]map[int32]int64 // the order topic's ends before the run
	group  string                     // a consumer group that read the order topic to its end
}

// dataset writes what a correct run leaves behind for n orders with the given prefix, in
// the database (through SQL: the checker must not care how it got there), on the order and
// granted topics, in a consumer group's committed offsets and in a ledger file: orders
// 0..n-6 GRANTED, two FAILED (stock exhausted), two quarantined after exhausting retries
// (grant LOCKED), one quarantined before any grant, and one poison record (a tombstone),
// quarantined as poison by the coupon plugin and the misbehaving plugin, whose rows are as
// chaosplan plans them.
func dataset(t *testing.T, d testenv.Database, brokers []string, topic, orderTopic, prefix string, n int) synthRun {
	t.Helper()
	// The statements run on MariaDB and PostgreSQL (OFTEST_DB): times, booleans and
	// bytes are Go values.
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := d.DB.Exec(rebind(d.DB, q), args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	const campaign, value = "double11-5yuan", 500
	now := time.Now().UTC()
	expire := now.Add(30 * 24 * time.Hour)
	sc := saramaConfig()
	sc.Producer.Return.Successes = true
	prod, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer prod.Close()
	start, err := TopicEnds(brokers, orderTopic)
	if err != nil {
		t.Fatalf("offsets: %v", err)
	}
	ids := make([]string, n)
	locked, granted := 0, 0
	for i := range n {
		id := fmt.Sprintf("%s-%06d", prefix, i)
		ids[i] = id
		couponID := uid()
		payload := fmt.Sprintf(`{"orderId":%q,"userId":"u%d","amountCents":1000}`, id, i)
		inbox := func(status, reason string, dups int) {
			var r any
			if reason != "" {
				r = reason
			}
			exec(`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, attempts, duplicates, expire_at)
 VALUES (?, 'coupon', ?, ?, ?, 'order-paid', 0, ?, ?, ?, 1, ?, ?)`, id, status, r, fmt.Sprintf("uuid-%d", i), i, []byte(payload), fmt.Sprintf("%064d", i), dups, expire)
		}
		grant := func(state, reason string, path ...string) {
			var r, cid any
			if reason != "" {
				r = reason
			}
			if state == "GRANTED" {
				cid = couponID
			}
			exec(`INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, version, value_cents, coupon_id, reason, stock_shard, budget_shard)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, 0)`, id, campaign, fmt.Sprintf("u%d", i), state, len(path)-1, value, cid, r)
			for j := 1; j < len(path); j++ {
				exec(`INSERT INTO coupon_grant_log (order_id, campaign_id, from_state, to_state) VALUES (?, ?, ?, ?)`, id, campaign, path[j-1], path[j])
			}
		}
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: orderTopic, Key: sarama.StringEncoder(id), Value: sarama.StringEncoder(payload)}); err != nil {
			t.Fatalf("send: %v", err)
		}
		status, reason := "done", any(nil)
		if b := chaosplan.For(id); b != chaosplan.Behave {
			status, reason = "failed", b.String()
		}
		exec(`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, attempts, expire_at)
 VALUES (?, 'chaos', ?, ?, ?, 'order-paid', 0, ?, ?, ?, 1, ?)`, id, status, reason, fmt.Sprintf("uuid-%d", i), i, []byte(payload), fmt.Sprintf("%064d", i), expire)
		outbox := func(typ, eventID, payload string) {
			exec(`INSERT INTO outbox (event_id, event_type, topic, msg_key, payload, published_at) VALUES (?, ?, ?, ?, ?, ?)`, eventID, typ, topic, id, []byte(payload), now)
		}
		switch {
		case i < n-5:
			if i%2 == 0 { // the batch's one committed transition
				grant("GRANTED", "", "INIT", "GRANTED")
			} else { // step by step
				grant("GRANTED", "", "INIT", "LOCKED", "BUDGET_DEDUCTED", "GRANTED")
			}
			exec(`INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES (?, ?, ?, ?, ?)`,
				couponID, id, campaign, fmt.Sprintf("u%d", i), value)
			inbox("done", "", i%3)
			eid := uid()
			ev := fmt.Sprintf(`{"eventId":%q,"orderId":%q}`, eid, id)
			outbox("CouponGranted", eid, ev)
			if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(id), Value: sarama.StringEncoder(ev),
				Headers: []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte(eid)}, {Key: []byte("event_type"), Value: []byte("CouponGranted")}}}); err != nil {
				t.Fatalf("send: %v", err)
			}
			granted++
		case i < n-3:
			grant("FAILED", "stock_exhausted", "INIT", "FAILED")
			inbox("done", "", 0)
			outbox("CouponGrantFailed", uid(), `{}`)
		case i < n-1:
			grant("LOCKED", "", "INIT", "LOCKED")
			inbox("failed", "retries_exhausted", 1)
			locked++
		default:
			inbox("failed", "permanent", 0)
		}
	}
	part, off, err := prod.SendMessage(&sarama.ProducerMessage{Topic: orderTopic, Key: sarama.StringEncoder("poison-0")}) // a tombstone
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	for _, biz := range []string{"coupon", "chaos"} {
		exec(`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, tombstone, fingerprint, expire_at)
 VALUES (?, ?, 'failed', 'poison', 'p', ?, ?, ?, ?, ?, 'f', ?)`, fmt.Sprintf("poison:%s/%d/%d", orderTopic, part, off), biz, orderTopic, part, off, []byte{}, true, expire)
	}
	ends, err := TopicEnds(brokers, orderTopic)
	if err != nil {
		t.Fatalf("offsets: %v", err)
	}
	group := "chk-" + prefix
	if err := commitOffsets(brokers, group, orderTopic, ends[orderTopic]); err != nil {
		t.Fatalf("commit offsets: %v", err)
	}
	exec(`INSERT INTO coupon_stock (campaign_id, shard, total, locked, granted) VALUES (?, 0, 1000000, ?, ?)`, campaign, locked, granted)
	exec(`INSERT INTO coupon_budget (campaign_id, shard, total_cents, spent_cents) VALUES (?, 0, 100000000, ?)`, campaign, granted*value)
	ledger := filepath.Join(t.TempDir(), "ledger.txt")
	body := fmt.Sprintf("# prefix=%s orders=%d deliveries=%d poison=1\n%s\n", prefix, n, n+n/3, strings.Join(ids, "\n"))
	if err := os.WriteFile(ledger, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return synthRun{ledger: ledger, start: start, group: group}
}

func uid() string {
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", rand.Uint32(), rand.Uint32()&0xffff, rand.Uint32()&0xffff, rand.Uint32()&0xffff, rand.Uint64()&0xffffffffffff)
}

// TestCheckerDetectsInjectedFaults runs the checker on a clean synthetic run (ok), then on
// a copy with each injectable fault: the checker must name each one.
func TestCheckerDetectsInjectedFaults(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "chaos-granted", 3)
	// One order topic for every case, each reading it from where its dataset began, its
	// group committed to the end of every partition at the time.
	orderTopic := testenv.Topic(t, kc, "chaos-orders", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	check := func(t *testing.T, d testenv.Database, orderTopic, prefix string, run synthRun) Report {
		t.Helper()
		rep, err := Check(ctx, CheckConfig{DSN: d.DSN, Brokers: kc.Brokers, GrantedTopic: topic, OrderTopic: orderTopic,
			StartOffsets: run.start, Prefix: prefix, Ledgers: []string{run.ledger}, Idle: time.Second,
			Misbehaver: "chaos", Groups: []GroupTopic{{run.group, orderTopic}}, LagWait: 2 * time.Second})
		if err != nil {
			t.Fatalf("checker: %v", err)
		}
		return rep
	}
	cases := append([]string{"clean"}, allInject...)
	for _, kind := range cases {
		t.Run(kind, func(t *testing.T) {
			d := testenv.DB(t, 4, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
			prefix := fmt.Sprintf("chk%d-%s", rand.Uint32(), kind)
			run := dataset(t, d, kc.Brokers, topic, orderTopic, prefix, 20)
			rep := check(t, d, orderTopic, prefix, run)
			if len(rep.Violations) != 0 || rep.Lost != 0 || rep.Duplicates() != 0 {
				t.Fatalf("clean dataset: violations %+v lost=%d duplicates=%d", rep.Violations, rep.Lost, rep.Duplicates())
			}
			if rep.Orders != 20 || rep.Granted != 15 || rep.Failed != 2 || rep.Quarantined != 3 || rep.GrantEvents != 15 || rep.DuplicatesBlocked != 17 ||
				rep.KafkaDeliveries != 20 || rep.PoisonOnKafka != 1 || rep.PoisonKinds["tombstone"] != 1 || rep.PoisonQuarantined != 1 || rep.MisbehaverPoison != 1 ||
				!rep.LagChecked || rep.LagTotal != 0 || len(rep.Lags) != 3 {
				t.Fatalf("clean dataset: unexpected counts %+v", rep)
			}
			if fmt.Sprint(rep.MisbehaverGot) != fmt.Sprint(rep.MisbehaverWant) || rep.MisbehaverWant["done"]+rep.MisbehaverWant["panic"]+rep.MisbehaverWant["timeout"] != 20 {
				t.Fatalf("clean dataset: misbehaver outcomes %v, planned %v", rep.MisbehaverGot, rep.MisbehaverWant)
			}
			line := summary(rep, 1, 2, 3, nil)
			if line != "CHAOS ok orders=20 kills=1 broker_restarts=2 db_restarts=3 lost=0 duplicates=0 lag=0" {
				t.Fatalf("summary: %s", line)
			}
			if kind == "clean" {
				return
			}
			done, err := inject(ctx, d.Admin, prefix, []string{kind}, injectTarget{Brokers: kc.Brokers, GrantedTopic: topic, OrderTopic: orderTopic, Misbehaver: "chaos"})
			if err != nil {
				t.Fatalf("inject: %v", err)
			}
			rep = check(t, d, orderTopic, prefix, run)
			line = summary(rep, 1, 2, 3, nil)
			want := injectKinds[kind]
			if !rep.Has(want) || !strings.HasPrefix(line, "CHAOS FAIL ") || !strings.Contains(line, " "+want+"=") {
				t.Fatalf("after %v the checker did not report %s: %s", done, want, line)
			}
			t.Logf("%v → %s", done, line)
		})
	}
}

func TestScheduleIsSeeded(t *testing.T) {
	for _, p := range profiles {
		a := schedule(p, rand.New(rand.NewPCG(7, 0xc4a05)))
		b := schedule(p, rand.New(rand.NewPCG(7, 0xc4a05)))
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%s: the same seed gave two schedules", p.name)
		}
		count := map[string]int{}
		for _, e := range a {
			count[e.kind]++
			if e.at < 0 || e.at > p.window {
				t.Fatalf("%s: event %+v outside the window", p.name, e)
			}
		}
		want := map[string]int{"kill": p.kills, "kafka": p.brokerRestarts, "db": p.dbRestarts, "join": p.joins, "leave": p.joins,
			"db-latency": p.latencies, "db-reset": p.resets, "db-cut": p.cuts,
			"kafka-latency": p.kLatencies, "kafka-reset": p.kResets, "kafka-cut": p.kCuts, "relay-crash": p.relayCrashes}
		for k, n := range want {
			if count[k] != n {
				t.Fatalf("%s: %d %s events, want %d (schedule %v)", p.name, count[k], k, n, count)
			}
		}
	}
}

package main

import (
	"strings"
	"testing"
)

const sampleCSV = `name,key,value
calibration,when,start
calibration,work_ms,160.2
inbox,round,1
inbox,mode,batch
inbox,orders_per_s,20000.0
inbox,round,2
inbox,mode,batch
inbox,orders_per_s,21000.0
inbox,mode,batch
inbox,orders_per_s,20500.0
inbox,min,20000.0
inbox,max,21000.0
inbox,rounds,2
inbox,overhead_pct_vs_unsafe,16.5
inbox,overhead_min,1.0
inbox,overhead_max,20.0
inbox,overhead_pooled_pct,12.0
inbox,overhead_cpu_pct,12.1
e2e,mode,batch
e2e,orders_per_s,13397.7
e2e,min,12952.0
e2e,max,13865.1
e2e,rounds,5
e2e,offered,preloaded
e2e,steady_orders_per_s,14248.9
e2e,steady_min,13810.1
e2e,steady_max,14760.3
e2e,mode,batch
e2e,offered_per_s,2000
e2e,p50_ms,22.2
e2e,p99_ms,43.3
e2e,p99_min,40.6
e2e,p99_max,47.4
e2e,rounds,5
kclient,round,1
kclient,client,sarama
kclient,op,consume
kclient,records,200000
kclient,records_per_s,500000.0
kclient,cpu_us_per_record,9.99
kclient,client,sarama
kclient,op,consume
kclient,records,200000
kclient,records_per_s,578151.5
kclient,cpu_us_per_record,0.74
kclient,rounds,3
kclient,client,kgo
kclient,op,consume
kclient,records,200000
kclient,records_per_s,1327568.8
kclient,cpu_us_per_record,0.62
kclient,rounds,3
kclient,client,sarama
kclient,op,produce
kclient,records,200000
kclient,records_per_s,196905.1
kclient,cpu_us_per_record,3.12
kclient,rounds,3
kclient,records_per_txn,2000
kclient,client,kgo
kclient,op,produce
kclient,records,200000
kclient,records_per_s,266025.5
kclient,cpu_us_per_record,1.13
kclient,rounds,3
kclient,records_per_txn,2000
kclient,client,router
kclient,op,consume
kclient,records,200000
kclient,records_per_s,200516.9
kclient,cpu_us_per_record,5.48
kclient,rounds,3
kclient,client,router_wait
kclient,op,consume
kclient,records,200000
kclient,records_per_s,120673.0
kclient,cpu_us_per_record,9.73
kclient,rounds,3
kclient,client,sarama
kclient,op,loop
kclient,records,200000
kclient,records_per_s,165238.0
kclient,cpu_us_per_record,3.74
kclient,kafka_cpu_us_per_record,4.1
kclient,rounds,3
kclient,max_records_per_txn,2000
kclient,client,kgo
kclient,op,loop
kclient,records,200000
kclient,records_per_s,222607.0
kclient,cpu_us_per_record,1.66
kclient,kafka_cpu_us_per_record,2.8
kclient,rounds,3
kclient,max_records_per_txn,2000
ratio,mode,kgo_vs_sarama
ratio,consume_cpu_pct,83.9
ratio,produce_cpu_pct,36.3
ratio,router_saving_us_per_order_bound,2.11
ratio,loop_cpu_pct,44.4
ratio,loop_saving_us_per_order,2.08
ratio,rounds,3
plain,mode,grouped
plain,orders_per_s,2613.0
plain,rounds,5
plain,total_cpu_us_per_order,498.0
ratio,plain_grouped_vs_single,2.40
ratio,plain_grouped_vs_coupon_batch,0.26
relay,events_per_s,62422.7
relay,events,200000
relay,mode,exactly_once
relay,batches,100
relay,start_ms,175
relay,db_cpu_us_per_event,16.9
relay,kafka_cpu_us_per_event,4.9
relay,bench_cpu_us_per_event,6.8
relay,total_cpu_us_per_event,28.7
router,mode,peak
router,orders_per_s,9000.0
router,max_rss_mb,124.4
router,cpu_us_per_order,84.0
router,orders,50000
router,deliveries,65204
router,start_ms,900.0
router,steady_orders_per_s,10000.0
router,db_cpu_us_per_order,60.0
router,kafka_cpu_us_per_order,10.0
router,router_cpu_us_per_order,84.0
router,total_cpu_us_per_order,154.0
router,mode,rate2000
router,offered_per_s,2000
router,orders_per_s,1999.0
router,max_rss_mb,152.8
router,cpu_us_per_order,68.0
router,seconds,20
router,p50_ms,20.1
router,p99_ms,40.2
router,db_cpu_us_per_order,180.0
router,kafka_cpu_us_per_order,150.0
router,router_cpu_us_per_order,68.0
router,total_cpu_us_per_order,398.0
router,mode,stalled_payloads
router,payloads,500
router,payload_bytes,1000000
router,partitions,12
router,stall_s,80.0
router,max_rss_mb,209.0
router,max_rss_first_mb,114.7
router,first_s,10.0
router,max_rss_stalled_mb,167.8
router,rss_processing_max_mb,209.3
router,recovered_s,41.8
router,granted,500
lean,mode,peak
lean,orders_per_s,17370.6
lean,orders,50000
lean,deliveries,65204
lean,max_rss_mb,45.2
lean,batch,2000
lean,kills,0
lean,db_cpu_us_per_order,36.0
lean,kafka_cpu_us_per_order,20.8
lean,lean_cpu_us_per_order,15.4
lean,total_cpu_us_per_order,72.2
lean,mode,rate2000
lean,offered_per_s,2000
lean,orders_per_s,1997.6
lean,max_rss_mb,26.0
lean,orders,40000
lean,seconds,20
lean,p50_ms,25.1
lean,p99_ms,39.5
lean,batch,2000
lean,db_cpu_us_per_order,79.5
lean,kafka_cpu_us_per_order,137.5
lean,lean_cpu_us_per_order,72.8
lean,total_cpu_us_per_order,289.8
relay_db,round,0
relay_db,mode,mark
relay_db,db_cpu_us_per_event,99.0
relay_db,mode,mark
relay_db,events,50000
relay_db,batch,2000
relay_db,db_cpu_us_per_event,9.6
relay_db,db_cpu_min,8.0
relay_db,db_cpu_max,16.0
relay_db,sweep_db_cpu_us_per_event,3.1
relay_db,rounds,3
relay_db,mode,delete
relay_db,db_cpu_us_per_event,13.0
relay_db,db_cpu_min,12.4
relay_db,db_cpu_max,14.2
relay_db,mode,select_only
relay_db,db_cpu_us_per_event,13.6
relay_db,db_cpu_min,13.4
relay_db,db_cpu_max,13.6
ratio,mode,relay_db_delete_vs_mark
ratio,mark_and_sweep_db_cpu_us_per_event,12.7
ratio,saving_db_cpu_us_per_event,-0.3
rows,mode,log3
rows,orders,30000
rows,db_cpu_us_per_order,17.0
rows,db_cpu_min,15.3
rows,db_cpu_max,21.7
rows,rounds,3
rows,mode,log1
rows,db_cpu_us_per_order,6.0
rows,db_cpu_min,5.7
rows,db_cpu_max,8.3
ratio,mode,rows_log
ratio,log1_saving_db_cpu_us_per_order,11.0
rows,mode,inbox
rows,db_cpu_us_per_order,9.7
rows,db_cpu_min,9.7
rows,db_cpu_max,10.0
rows,mode,inbox_key
rows,db_cpu_us_per_order,5.3
rows,db_cpu_min,5.0
rows,db_cpu_max,5.7
ratio,mode,rows_inbox
ratio,key_db_cpu_us,5.3
ratio,index_db_cpu_us,1.3
ratio,columns_db_cpu_us,3.0
targets,e2e_vs_peer,11.0
targets,e2e_vs_peer_10x,pass
targets,router_rss_peak_mb,124.4
targets,router_rss_2000_mb,152.8
targets,router_rss,fail
targets,e2e_vs_inbox_ceiling_pct,63.12
targets,e2e_vs_inbox_interleaved_pct,58.0
targets,e2e_080_ceiling,fail
targets,router_cpu_us_per_order,84.0
targets,router_cpu_32us,fail
calibration,when,end
calibration,work_ms,156.3
`

func TestBenchTable(t *testing.T) {
	recs, err := parseBenchCSV(strings.NewReader(sampleCSV))
	if err != nil {
		t.Fatal(err)
	}
	// Lines split where a key repeats: 2 calibration, 3 inbox, 2 e2e, 9 kclient, 2 ratio,
	// 1 plain, 1 relay, 3 router, 2 lean, 5 relay_db (1 a round) with its ratio, 4 rows with
	// their 2, 1 targets.
	if len(recs) != 37 {
		t.Fatalf("%d lines, want 37: %+v", len(recs), recs)
	}
	b := benchRun{source: "x.csv", recs: recs}
	table, err := b.table()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"**160.2 ms at the start, — before the e2e runs, 156.3 at the end**",
		"**13,398 orders/s** (rounds 12,952–13,865); steady 14,249",
		"20,500 orders/s (20,000–21,000); overhead median **16.5 %**", // the median line, not a round's
		"≤ 15 % by each of the three: **not met**",
		"p99 **43.3** (40.6–47.4)", "p99 ≤ 100 ms at 2,000/s: met",
		"grouped 2,613 orders/s (498 µs CPU per order)", "2.40×; 0.26", "≥ 10×: **not met**; ≥ 0.5: **not met**",
		"50,000 orders pre-loaded (65,204 deliveries, 30 % twice)", "9,000 orders/s (steady 10,000); peak RSS **124.4 MB**; router 84 µs CPU per order (MariaDB 60, Kafka 10; 154 in all) | ≤ 150 MB: met",
		"`router` `rate2000`: the same binary at 2,000 orders/s offered, 20 s measured", "p99 40.2 ms; peak RSS **152.8 MB**", "≤ 150 MB: **not met**",
		"`router` `stalled_payloads`: 500 orders of 1.00 MB (under `inbox.max_payload_bytes`, so they wait whole) on 12 partitions while a transaction holds the inbox for 80 s | peak RSS 114.7 MB after 10 s, 167.8 MB at the end of the stall, **209.0 MB** in all (processing); 500 granted, 41.8 s after the database came back | ≤ 300 MB, all granted: met",
		"`lean`: the batch-native floor on the peak run's input (50,000 orders, 65,204 deliveries), a process of its own: per poll of up to 2,000 records",
		"17,371 orders/s; peak RSS 45.2 MB; its process 15.4 µs CPU per order (MariaDB 36, Kafka 21; **72 in all**); the router's peak run **5.5×** its process's CPU per order, 2.1× in all | —",
		"| `lean` `rate2000`: the same pipeline at 2,000 orders/s offered, 20 s measured, as the router's line below | 1,998 orders/s, p50 25.1 ms, p99 **39.5 ms**; peak RSS 26.0 MB; its process 73 µs CPU per order (MariaDB 80, Kafka 138; 290 in all) | — |",
		"| `relay`: outbox → Kafka, events/s | exactly once 62,423 (28.7 µs CPU per event: MariaDB 16.9, Kafka 4.9, the relay's process 6.8) |",
		"router binary peak RSS 124 MB at its peak rate, 153 MB at 2,000/s (fail)",
		"e2e **63.1 %** of the in-process inbox ceiling (fail; the databases group's back-to-back rounds: 58.0 %)",
		"router binary **84 µs** CPU per order at its peak (fail)",
		"30,000 orders, 3 rounds: MariaDB CPU µs per order (medians; rounds' range) | transition log, 3 rows 17.0 (15.3–21.7); transition log, 1 row 6.0 (5.7–8.3); one log row instead of three saves **11.0 µs per order**",
		"read and mark 9.6 (8.0–16.0); the retention sweep of the same rows 3.1 more (run at once here, by the cleaner after `relay.retention`); read and delete by position 13.0 (12.4–14.2); the read alone 13.6 (13.4–13.6). Deleting instead of marking: **+3.4 µs per event** while publishing, the sweep's 3.1 µs later saved", // the median line, not a round's
		"`kclient`: the Kafka client, Sarama vs franz-go (kgo), alone and under the router's consuming path, 200,000 records, 2,000 per transaction, 3 rounds",
		"consume: Sarama 0.74 (578,152 records/s), kgo 0.62 (1,327,569 records/s), kgo **83.9 %** of Sarama's", // the median line, not a round's
		"transactional produce: Sarama 3.12 (196,905 records/s), kgo 1.13 (266,026 records/s), kgo **36.3 %** of Sarama's",
		"a batch's events and its offsets in one transaction (`loop`, up to 2,000 records each): Sarama 3.74 (165,238 records/s), kgo 1.66 (222,607 records/s), kgo **44.4 %** of Sarama's, 2.08 µs per order less; the broker 4.1 and 2.8",
		"router saving bound **2.11 µs per order** (2.5 % of the router's 84 µs at its peak) | kgo only with ≥ 20 % less router CPU per order: **out of reach**",
		"Sarama under the router's consuming path (kafkax's window and consumer loop, no database): 5.48 with a handler returning at once, 9.73 with handlers parked until their batch of 512 is released",
		"a new row 9.7 (9.7–10.0); a row of only the unique key 5.3 (5.0–5.7); of a new row: the key **5.3**, the secondary index 1.3, the other columns (message id, source, payload, metadata, fingerprint, status, expiry) 3.0",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if _, err := (benchRun{recs: recs[:2]}).table(); err == nil {
		t.Error("a CSV without the e2e and inbox medians made a table")
	}
}

func TestReplaceRegion(t *testing.T) {
	doc := "a\n<!-- t:start -->\nold\nlines\n<!-- t:end -->\nb\n"
	out, err := replaceRegion([]byte(doc), "t", "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "a\n<!-- t:start -->\nnew\n<!-- t:end -->\nb\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := replaceRegion([]byte(doc), "other", "x"); err == nil {
		t.Error("a missing region was not an error")
	}
}

const sampleChaos = `chaos: router built from the working tree at 09b4fd5
chaos: [   0.1s] profile short seed 1 prefix chaos1-1 run dir .run/chaos/last
chaos: [ 110.0s] faults over: kills=8 broker_restarts=1 db_restarts=1 relay_crashes=1/1 unplanned_router_exits=11; healing and draining (≤ 2m30s)
chaos: [ 110.0s] network faults: db proxy connections=4296 latency=2 resets=2 cuts=1; kafka proxy connections=511 latency=2 resets=2 cuts=1
chaos: [ 150.0s] checker: orders=3000 granted=2994 failed=0 quarantined=6 [retries_exhausted=6] lost=0
chaos: [ 150.0s] checker: deliveries=4077 (order-paid messages of the run on Kafka; ledgers declare 3887, segment re-sends add to it) duplicates_blocked=1295 redeliveries≈218 poison=96 quarantined_as_poison=102
chaos: [ 150.0s] checker: acked_skipped=164 (offsets of coupon-sender acked past a committed offset and not handed out again, in 9 claims; from the routers' logs)
chaos: [ 150.0s] checker: grant_events=2994 (distinct CouponGranted event ids, read_committed) duplicate_events=0 duplicate_coupons=0 transitions=8993
chaos: [ 150.0s] checker: committed lag 0: coupon-sender 0, chaos-misbehaver 0
chaos: runtime 153s (run dir .run/chaos/last)
CHAOS ok orders=3000 kills=8 broker_restarts=1 db_restarts=1 lost=0 duplicates=0 lag=0
`

func TestChaosTable(t *testing.T) {
	c, err := parseChaosLog(sampleChaos)
	if err != nil {
		t.Fatal(err)
	}
	table := c.table()
	for _, want := range []string{
		"Profile `short`, seed 1, router built from the working tree at 09b4fd5; 153 s.",
		"| outcome | **ok** |", "| orders | 3000 (4077 order-paid",
		"| relay crashes between the Kafka commit and the database mark | 1/1",
		"| lost | **0** |", "**0** / **0** (2994 distinct", "1295 (≈218)",
		"| messages acked past a committed offset, not handed out again after a restart or a rebalance | 164 |",
		"| committed lag | 0: coupon-sender 0",
		"```\nCHAOS ok orders=3000 kills=8 broker_restarts=1 db_restarts=1 lost=0 duplicates=0 lag=0\n```",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	g, err := parseChaosLog(strings.Replace(sampleChaos, "profile short", "profile galera", 1) + "CHAOS ok profile=galera orders=3000 db_node_kills=3 router_kills=7 broker_restarts=1 lost=0 duplicates=0 lag=0 orders_per_s_galera=80 orders_per_s_single=120\n")
	if err != nil {
		t.Fatal(err)
	}
	if g.region() != "chaos-galera-table" {
		t.Errorf("galera run's region %q", g.region())
	}
	for _, want := range []string{"routers wrote to (each rejoined and Synced before the next) | 3 |", "| orders/s fault-free, Galera cluster / single node | 80 / 120 |"} {
		if !strings.Contains(g.table(), want) {
			t.Errorf("galera table lacks %q:\n%s", want, g.table())
		}
	}
	if _, err := parseChaosLog("chaos: building\n"); err == nil {
		t.Error("output without a CHAOS line parsed")
	}
	if _, err := parseChaosLog("CHAOS FAIL harness: infra.sh up: exit 1\n"); err == nil {
		t.Error("a run whose checker did not report parsed")
	}
}

// The targets row states the hot path's targets, and the lean pipeline's figures beside the
// router's when the run measured it.
func TestHotPathTargets(t *testing.T) {
	const hot = `targets,router_cpu_20us,fail
targets,all_cpu_us_per_order,136.0
targets,all_cpu_60us,fail
targets,lean_cpu_us_per_order,15.4
targets,lean_all_cpu_us_per_order,72.2
targets,router_vs_lean_cpu,2.79
targets,all_vs_lean_all_cpu,1.88
targets,lean_p99_ms_at_2000,39.5
targets,router_vs_lean_p99,1.02
calibration,when,end
`
	recs, err := parseBenchCSV(strings.NewReader(strings.Replace(sampleCSV, "calibration,when,end\n", hot, 1)))
	if err != nil {
		t.Fatal(err)
	}
	table, err := benchRun{source: "x.csv", recs: recs}.table()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"the hot path's: router binary 84 µs CPU per order at its peak (fail), all its processes 136 µs (fail)",
		"; the lean pipeline on the same input: 15.4 µs CPU per order its process, 72 in all (the router 2.8× and 1.9×); its p99 at 2,000/s 39.5 ms (the router 1.0×)",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

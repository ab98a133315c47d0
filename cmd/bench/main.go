// Command bench measures onceflow on the real MariaDB and Kafka started by
// scripts/infra.sh, and prints one machine-readable BENCH line per measurement (plus a CSV
// under bench/results/). Speed is measured here, never asserted in a test.
//
//	go run ./cmd/bench [-orders 20000] [-workers 16]
package main

import (
	"context"
	"database/sql"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/gcx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

type result struct {
	name   string
	fields [][2]string
}

var results []result

// round, when not 0, tags the lines report prints with the round of a repeated measurement
// (the chart skips them; the medians of the rounds are reported after them, untagged).
var round int

func report(name string, kv ...any) {
	r := result{name: name}
	line := "BENCH name=" + name
	if round > 0 {
		kv = append([]any{"round", round}, kv...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		v := fmt.Sprint(kv[i+1])
		if f, ok := kv[i+1].(float64); ok {
			v = strconv.FormatFloat(f, 'f', 1, 64)
		}
		r.fields = append(r.fields, [2]string{fmt.Sprint(kv[i]), v})
		line += fmt.Sprintf(" %s=%s", kv[i], v)
	}
	results = append(results, r)
	fmt.Println(line)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

var (
	orders      = flag.Int("orders", 5000, "orders per database measurement")
	workers     = flag.Int("workers", 16, "concurrent workers (database measurements)")
	e2eN        = flag.Int("e2e-orders", 5000, "orders for the end-to-end throughput run")
	relayN      = flag.Int("relay-events", 50000, "outbox rows for the relay measurement")
	stormN      = flag.Int("storm-orders", 10000, "orders in the duplicate storm")
	relayBatch  = flag.Int("relay-batch", 2000, "relay batch size (events per Kafka transaction)")
	relayShards = flag.Int("relay-shards", 4, "outbox shards of the sharded exactly-once relay measurement (<2 skips it)")
	stormK      = flag.Int("storm-deliveries", 50, "deliveries of each order in the storm")
	e2eSPT      = flag.Int("e2e-steps-per-tx", 1, "inbox.steps_per_transaction of the end-to-end runs")
	loads       = flag.String("loads", "100,200", "offered loads (orders/s) for the latency runs, one at a time")
	batchLoads  = flag.String("batch-loads", "500,1000,2000", "offered loads (orders/s) for the latency runs, group commit")
	e2eShards   = flag.Int("e2e-relay-shards", 1, "relay.shards of the end-to-end runs")
	e2eParts    = flag.Int("e2e-partitions", 12, "partitions of the end-to-end runs' order-paid and coupon-granted topics (scripts/infra.sh creates 12)")
	e2eLinger   = flag.Duration("e2e-relay-linger", 5*time.Millisecond, "relay.linger of the end-to-end runs (configs/router.yaml's)")
	e2eBatchN   = flag.Int("e2e-batch-orders", 50000, "orders for the end-to-end throughput run, group commit")
	loadSecs    = flag.Int("load-seconds", 8, "seconds per latency run")
	rounds      = flag.Int("rounds", 5, "rounds of the e2e group-commit measurements; their medians are reported (the machine is noisy)")
	warmSecs    = flag.Int("warmup-seconds", 2, "seconds each latency run's load runs before it is measured")
	adminDSN    = flag.String("admin-dsn", "onceflow_admin:onceflow_admin@tcp(127.0.0.1:3306)/onceflow_bench", "privileged DSN of the bench database")
	appDSN      = flag.String("dsn", "onceflow:onceflow@tcp(127.0.0.1:3306)/onceflow_bench", "application DSN of the bench database")
	brokers     = flag.String("brokers", "127.0.0.1:9092", "Kafka brokers")
	outDir      = flag.String("out", "bench/results", "where the CSV goes")
	gogc        = flag.Int("gogc", gcx.DefaultPercent, "Go GC target of the bench process (the router's runtime.gogc default; GOGC in the environment wins)")
	latencyDump = flag.String("latency-dump", "", "write every measured order's stage latencies to FILE-<offered rate>.csv (diagnosis of the tail; also times when each order reached the handler, at some CPU cost, and when it was due as Unix ms, to line orders up with other logs)")
)

func run() error {
	flag.Parse()
	if *rounds < 1 || *batchRounds < 1 {
		return fmt.Errorf("-rounds %d, -batch-rounds %d: want at least 1", *rounds, *batchRounds)
	}
	if err := gcx.Validate(*gogc, 0); err != nil {
		return fmt.Errorf("-gogc: %w", err)
	}
	// The router's collector setting (runtime.gogc), for the unsafe baseline and the
	// inbox alike; GOGC in the environment wins, as in the router.
	fmt.Printf("bench: %s\n", gcx.Apply(*gogc, 0))
	ctx := context.Background()
	kc := kafkax.Config{Brokers: []string{*brokers}, ClientID: "onceflow-bench"}
	kc.SetDefaults()
	fmt.Printf("bench: %d workers, GOMAXPROCS=%d; MariaDB and Kafka share this machine\n", *workers, runtimeProcs())
	stopProfile, err := startProfile()
	if err != nil {
		return err
	}
	defer stopProfile()

	db, err := freshDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()

	calibrate("start")
	if want("batch") {
		// Group commit (inbox.Batcher): many deliveries per transaction, multi-row statements.
		// Two baselines: the handler alone on pre-built batches (a ceiling), and the same
		// delivery path as the Batcher's without the inbox (the overhead baseline). Run in
		// -batch-rounds back-to-back triples; the overhead is the median of the rounds'
		// overheads, and pooled: 1 − (the baseline's total time) / (the inbox's total time).
		// Odd rounds run the baseline before the inbox, even rounds after it, so neither
		// always inherits the other's background work (InnoDB flushing the last run's pages).
		// Many short rounds (15 of 15,000 orders) rather than a few long ones: the machine's
		// speed drifts over seconds, and the two sides of a short round see the same speed.
		var hs, us, is, ohU, ohH []float64
		var tU, tI float64       // total seconds, for the pooled overhead
		var cpuU, cpuI []float64 // CPU µs per order of each round (all processes): on a CPU-bound
		// machine 1 − CPU_baseline/CPU_inbox is the throughput the inbox costs, and CPU time
		// does not count the waits in which the machine's drift shows most
		for r := 1; r <= *batchRounds; r++ {
			round = r
			h, err := benchUnsafeBatch(ctx, db)
			if err != nil {
				return fmt.Errorf("unsafe batch: %w", err)
			}
			var u, i float64
			var printInbox func(unsafe, handlerOnly float64)
			for _, inboxFirst := range []bool{r%2 == 0, r%2 == 1} {
				if inboxFirst {
					if i, printInbox, err = benchInboxBatch(ctx, db); err != nil {
						return fmt.Errorf("inbox batch: %w", err)
					}
					cpuI = append(cpuI, lastTotalCPU)
				} else if u, err = benchUnsafeSamePath(ctx, db); err != nil {
					return fmt.Errorf("unsafe batch: %w", err)
				} else {
					cpuU = append(cpuU, lastTotalCPU)
				}
			}
			printInbox(u, h)
			hs, us, is = append(hs, h), append(us, u), append(is, i)
			ohU, ohH = append(ohU, (u-i)/u*100), append(ohH, (h-i)/h*100)
			tU, tI = tU+float64(*batchOrders)/u, tI+float64(*batchOrders)/i
		}
		round = 0
		report("unsafe", "mode", "handler_only", "orders_per_s", median(hs), "min", slices.Min(hs), "max", slices.Max(hs), "rounds", *batchRounds)
		report("unsafe", "mode", "batch", "orders_per_s", median(us), "min", slices.Min(us), "max", slices.Max(us), "rounds", *batchRounds)
		report("inbox", "mode", "batch", "orders_per_s", median(is), "min", slices.Min(is), "max", slices.Max(is), "rounds", *batchRounds,
			"overhead_pct_vs_unsafe", median(ohU), "overhead_min", slices.Min(ohU), "overhead_max", slices.Max(ohU),
			"overhead_pooled_pct", (1-tU/tI)*100, "overhead_cpu_pct", (1-median(cpuU)/median(cpuI))*100,
			"overhead_pct_vs_handler_only", median(ohH))
	}
	if want("plain") {
		// A plain one-step handler (no batch code): one delivery per transaction, and group
		// commit (a savepoint per delivery when needed), beside the coupon BatchHandler
		// (plain.go).
		if err := benchPlain(ctx, db); err != nil {
			return err
		}
	}
	// steps_per_tx=1 is the default (each state transition commits on its own); 3 runs the
	// whole grant in one transaction (inbox.steps_per_transaction), same guarantees.
	for _, spt := range []int{1, 3} {
		if !want("single") {
			break
		}
		if err := benchUnsafe(ctx, db, spt); err != nil {
			return fmt.Errorf("unsafe: %w", err)
		}
		if err := benchInbox(ctx, db, spt); err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
	}
	if !want("single") {
	} else if err := benchNaive(ctx, db); err != nil {
		return fmt.Errorf("naive: %w", err)
	}
	if !want("storm") {
	} else if err := benchStorm(ctx, db); err != nil {
		return fmt.Errorf("storm: %w", err)
	}
	if !want("relay") {
	} else if err := benchRelay(ctx, db, kc); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if !want("relay") {
	} else if err := benchForwarder(ctx, db, kc); err != nil { // Watermill's forwarder, next to the relay lines
		return fmt.Errorf("watermill_forwarder: %w", err)
	}
	if !want("e2e") {
	} else {
		calibrate("before_e2e")
		// Group commit, -rounds times; then the medians of the rounds.
		var tput, steady []float64
		p50s, p99s, achieved := map[int][]float64{}, map[int][]float64{}, map[int][]float64{}
		for r := 1; r <= *rounds; r++ {
			round = r
			res, err := benchE2E(ctx, db, kc, "batch", *e2eBatchN, *batchLoads)
			if err != nil {
				return fmt.Errorf("e2e batch: %w", err)
			}
			tput, steady = append(tput, res.ordersPerS), append(steady, res.steadyPerS)
			for load, l := range res.lat {
				p50s[load], p99s[load], achieved[load] = append(p50s[load], l[0]), append(p99s[load], l[1]), append(achieved[load], l[2])
			}
		}
		round = 0
		report("e2e", "mode", "batch", "orders_per_s", median(tput), "min", slices.Min(tput), "max", slices.Max(tput), "rounds", *rounds, "offered", "preloaded",
			"steady_orders_per_s", median(steady), "steady_min", slices.Min(steady), "steady_max", slices.Max(steady))
		for _, load := range splitInts(*batchLoads) {
			report("e2e", "mode", "batch", "offered_per_s", load, "orders_per_s", median(achieved[load]), "p50_ms", median(p50s[load]), "p99_ms", median(p99s[load]),
				"p99_min", slices.Min(p99s[load]), "p99_max", slices.Max(p99s[load]), "rounds", *rounds)
		}
		if *e2eN > 0 {
			if _, err := benchE2E(ctx, db, kc, "single", *e2eN, *loads); err != nil {
				return fmt.Errorf("e2e single: %w", err)
			}
		}
	}
	if want("seed") {
		calibrate("before_seed")
		for _, mode := range []string{"batch", "single"} {
			if err := benchSeedLoad(ctx, db, kc, mode); err != nil {
				return fmt.Errorf("seed_load %s: %w", mode, err)
			}
		}
	}
	calibrate("end")
	return writeCSV()
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// benchLock holds the bench database's named lock for the life of the process.
var benchLock *sql.Conn

func freshDB(ctx context.Context) (*sql.DB, error) {
	if err := dbx.CreateDatabase(ctx, *adminDSN); err != nil {
		return nil, err
	}
	admin, err := dbx.Open(ctx, dbx.Config{DSN: *adminDSN, MaxOpenConns: 2})
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	// Two benches on one database truncate each other's tables and relay each other's
	// outbox rows: refuse to start while another holds the lock.
	lockDB, err := dbx.Open(ctx, dbx.Config{DSN: *adminDSN, MaxOpenConns: 1})
	if err != nil {
		return nil, err
	}
	if benchLock, err = lockDB.Conn(ctx); err != nil {
		return nil, err
	}
	var got sql.NullInt64
	if err := benchLock.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT(DATABASE(), '.onceflow-bench'), 0)").Scan(&got); err != nil {
		return nil, err
	}
	if got.Int64 != 1 {
		return nil, fmt.Errorf("another bench is running against this database (%s); wait for it, or stop it", dbx.MaskDSN(*adminDSN))
	}
	couponSchema := migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations}
	_ = migrations.Reset(ctx, admin, couponSchema)
	if err := migrations.Up(ctx, admin, couponSchema); err != nil {
		return nil, err
	}
	return dbx.Open(ctx, dbx.Config{DSN: *appDSN, MaxOpenConns: *workers + 8})
}

// truncate empties the tables a measurement writes, with TRUNCATE on the bench's admin
// connection (the application user may only DELETE): a DELETE of the previous round's
// rows left InnoDB purging them, and their half-empty pages, under the next round.
func truncate(ctx context.Context) error {
	for _, t := range []string{"inbox", "coupon_grant", "coupon_grant_log", "user_coupon", "outbox", "coupon_stock", "coupon_budget"} {
		if _, err := benchLock.ExecContext(ctx, "TRUNCATE TABLE "+t); err != nil {
			return fmt.Errorf("truncate %s: %w", t, err)
		}
	}
	return nil
}

func granter(ctx context.Context, db *sql.DB, topic string) (*coupon.Granter, coupon.Config, error) {
	cfg := coupon.DefaultConfig()
	// Never the real topics: a relay left running on the bench database (another bench
	// process) once published 150,000 bench events into coupon-granted.
	// Runs with a relay pass their own topic, for both kinds of event (a failed grant there
	// fails checkGranted); the others never relay, and name no existing topic.
	cfg.GrantedTopic, cfg.FailedTopic = "bench-unrelayed-granted", "bench-unrelayed-failed"
	if topic != "" {
		cfg.GrantedTopic, cfg.FailedTopic = topic, topic
	}
	if err := coupon.EnsureCampaign(ctx, db, cfg); err != nil {
		return nil, cfg, err
	}
	g, err := coupon.NewGranter(cfg, nil, nil)
	if err != nil {
		return nil, cfg, err
	}
	// As the router's plugin does: the batched inserts prepared on db, for the inbox and the
	// unsafe baseline alike.
	return g.UseStatements(db), cfg, nil
}

func order(prefix string, i int) coupon.OrderPaid {
	return coupon.OrderPaid{OrderID: fmt.Sprintf("%s-%07d", prefix, i), UserID: fmt.Sprintf("u%d", i%100000), AmountCents: 1999,
		PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond)}
}

// parallel runs fn for 0..n-1 on the workers and returns the elapsed time.
func parallel(n int, fn func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || firstErr.Load() != nil {
					return
				}
				if err := fn(i); err != nil {
					firstErr.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return 0, e.(error)
	}
	return time.Since(start), nil
}

// benchUnsafe: the same handler steps without the inbox (the overhead baseline). Each
// delivery, duplicates included, runs the steps; the state machine keeps it correct, but
// nothing records the delivery.
func benchUnsafe(ctx context.Context, db *sql.DB, spt int) error {
	if err := truncate(ctx); err != nil {
		return err
	}
	g, _, err := granter(ctx, db, "")
	if err != nil {
		return err
	}
	defer g.Close()
	el, err := parallel(*orders, func(i int) error {
		o := order("unsafe", i)
		for {
			var prog inbox.Progress
			err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
				var err error
				for range spt {
					if prog, err = g.Step(ctx, tx, o); err != nil || prog == inbox.Done {
						return err
					}
				}
				return nil
			})
			if err != nil {
				if dbx.IsLockConflict(err) {
					continue
				}
				return err
			}
			if prog == inbox.Done {
				return nil
			}
		}
	})
	if err != nil {
		return err
	}
	report("unsafe", "steps_per_tx", spt, "orders_per_s", float64(*orders)/el.Seconds(), "orders", *orders, "seconds", el.Seconds())
	unsafeRate = float64(*orders) / el.Seconds()
	return nil
}

var unsafeRate float64

// benchInbox: every order through the inbox, plus 30 % duplicate deliveries.
func benchInbox(ctx context.Context, db *sql.DB, spt int) error {
	if err := truncate(ctx); err != nil {
		return err
	}
	g, _, err := granter(ctx, db, "")
	if err != nil {
		return err
	}
	defer g.Close()
	ib, err := inbox.New(db, g, inbox.Config{BizType: coupon.BizType, StepsPerTx: spt}, nil, nil)
	if err != nil {
		return err
	}
	el, err := parallel(*orders, func(i int) error {
		o := order("inbox", i)
		_, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"}, inbox.ProcessOptions{})
		return err
	})
	if err != nil {
		return err
	}
	rate := float64(*orders) / el.Seconds()
	dups := *orders * 3 / 10
	del, err := parallel(dups, func(i int) error {
		o := order("inbox", i*3)
		_, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"}, inbox.ProcessOptions{})
		return err
	})
	if err != nil {
		return err
	}
	overhead := 0.0
	if unsafeRate > 0 {
		overhead = (unsafeRate - rate) / unsafeRate * 100
	}
	report("inbox", "steps_per_tx", spt, "orders_per_s", rate, "overhead_pct_vs_unsafe", overhead, "duplicates_per_s", float64(dups)/del.Seconds())
	return nil
}

// benchStorm: every order delivered many times at once (a replay storm): exactly one
// coupon each, and how long the inbox takes to absorb it.
func benchStorm(ctx context.Context, db *sql.DB) error {
	if err := truncate(ctx); err != nil {
		return err
	}
	// Through the router's default path (group commit), offered by many concurrent senders.
	b, _, closeBatcher, err := newBatcher(ctx, db)
	if err != nil {
		return err
	}
	defer closeBatcher()
	defer withWorkers(*batchSenders)()
	total := *stormN * *stormK
	el, err := parallel(total, func(i int) error {
		o := order("storm", i / *stormK) // each order's deliveries arrive back to back
		_, err := b.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "bench"})
		return err
	})
	if err != nil {
		return err
	}
	var coupons, dups, blocked int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM user_coupon WHERE order_id LIKE 'storm-%'), (SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM user_coupon WHERE order_id LIKE 'storm-%'), (SELECT COALESCE(SUM(duplicates), 0) FROM inbox)").Scan(&coupons, &dups, &blocked); err != nil {
		return err
	}
	report("storm", "orders", *stormN, "deliveries_each", *stormK, "seconds", el.Seconds(), "coupons", coupons, "duplicate_coupons", dups,
		"duplicates_blocked", blocked, "deliveries_per_s", float64(total)/el.Seconds())
	return nil
}

// benchNaive: SELECT-then-INSERT under duplicate deliveries (each order delivered twice at once).
func benchNaive(ctx context.Context, db *sql.DB) error {
	n := *orders
	start := time.Now()
	var dups atomic.Int64
	seen := sync.Map{}
	_, err := parallel(n*2, func(i int) error {
		id := fmt.Sprintf("naive-%07d", i/2)
		var c int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM user_coupon WHERE order_id = ? AND campaign_id = 'naive'", id).Scan(&c); err != nil {
			return err
		}
		if c > 0 {
			return nil
		}
		// The naive table has no unique key in the incident; here the unique key catches
		// what the SELECT let through, and we count it as the duplicate it would have been.
		_, err := db.ExecContext(ctx, "INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES (?, ?, 'naive', 'u', 500)",
			watermill.NewUUID(), id)
		if dbx.IsDuplicate(err) {
			dups.Add(1)
			return nil
		}
		if err == nil {
			if _, loaded := seen.LoadOrStore(id, true); loaded {
				dups.Add(1)
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	el := time.Since(start)
	report("naive", "orders_per_s", float64(n)/el.Seconds(), "duplicates", dups.Load(), "deliveries", n*2)
	return nil
}

// benchRelay: outbox rows already committed → relay to a fresh topic.
func benchRelay(ctx context.Context, db *sql.DB, kc kafkax.Config) error {
	if err := truncate(ctx); err != nil {
		return err
	}
	topic, cleanup, err := makeTopic(kc, "bench-relay", 12)
	if err != nil {
		return err
	}
	defer cleanup()
	w, _ := outbox.NewWriter("outbox")
	payload := []byte(`{"eventId":"x","orderId":"o","userId":"u","campaignId":"c","couponId":"k","valueCents":500}`)
	for start := 0; start < *relayN; start += 1000 {
		err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
			for i := start; i < min(start+1000, *relayN); i++ {
				if err := w.Add(ctx, tx, outbox.Event{ID: watermill.NewUUID(), Type: "Bench", Topic: topic, Key: fmt.Sprintf("k%d", i%5000), Payload: payload}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	alo, err := outbox.NewRelay(db, producer, outbox.RelayConfig{BatchSize: *relayBatch}, nil)
	if err != nil {
		return err
	}
	if err := drainRelay(ctx, alo, "at_least_once", 0); err != nil {
		return err
	}
	// The same rows again, through the exactly-once relay (transactional producer, positions
	// in the same Kafka transaction, lease).
	if _, err := db.ExecContext(ctx, "UPDATE outbox SET published_at = NULL"); err != nil {
		return err
	}
	positions, dropPositions := positionsTopic(kc)
	defer dropPositions()
	eos, err := outbox.NewExactlyOnceRelay(db, kc, outbox.RelayConfig{BatchSize: *relayBatch, PositionsTopic: positions,
		TransactionalID: fmt.Sprintf("bench-%d", time.Now().UnixNano())}, nil)
	if err != nil {
		return err
	}
	defer eos.Close()
	if err := drainRelay(ctx, eos, "exactly_once", 1); err != nil || *relayShards < 2 {
		return err
	}
	// Once more with the outbox split into shards, published at once by one relay (one
	// transactional producer per shard).
	if _, err := db.ExecContext(ctx, "UPDATE outbox SET published_at = NULL"); err != nil {
		return err
	}
	shardPositions, dropShardPositions := positionsTopic(kc)
	defer dropShardPositions()
	sharded, err := outbox.NewExactlyOnceRelay(db, kc, outbox.RelayConfig{BatchSize: *relayBatch, Shards: *relayShards, Shard: "bench",
		PositionsTopic: shardPositions, TransactionalID: fmt.Sprintf("bench-sharded-%d", time.Now().UnixNano())}, nil)
	if err != nil {
		return err
	}
	defer sharded.Close()
	return drainRelay(ctx, sharded, fmt.Sprintf("exactly_once_%d_shards", *relayShards), *relayShards)
}

// drainRelay runs the relay as the router does (Run: in exactly-once mode a batch's database
// mark overlaps the next batch's read and Kafka transaction) until it has published and
// marked every row. The rate is timed from the end of the relay's start (lease, session,
// reconciliation; reported as start_ms), which happens once per process.
func drainRelay(ctx context.Context, relay *outbox.Relay, mode string, sessions int) error {
	begin := time.Now()
	start := begin
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	deadline := time.After(5 * time.Minute)
	started := sessions == 0
	for relay.Published() < int64(*relayN) {
		if !started && relay.Sessions() >= int64(sessions) {
			started, start = true, time.Now()
		}
		select {
		case err := <-done:
			cancel()
			return fmt.Errorf("%s: relay stopped after %d events: %v", mode, relay.Published(), err)
		case <-deadline:
			// Stuck: show where every goroutine is before stopping it.
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			cancel()
			<-done
			return fmt.Errorf("%s: %d of %d events after 5 minutes (failures %d)", mode, relay.Published(), *relayN, relay.Failures())
		case <-time.After(2 * time.Millisecond):
		}
	}
	el := time.Since(start)
	cancel()
	<-done
	report("relay", "events_per_s", float64(relay.Published())/el.Seconds(), "events", relay.Published(), "mode", mode, "batches", relay.Batches(),
		"start_ms", start.Sub(begin).Milliseconds())
	return nil
}

func makeTopic(kc kafkax.Config, prefix string, parts int32) (string, func(), error) {
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	admin, err := sarama.NewClusterAdmin(kc.Brokers, sc)
	if err != nil {
		return "", nil, kafkax.Unreachable(kc.Brokers, err)
	}
	name := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: parts, ReplicationFactor: 1}, false); err != nil {
		admin.Close()
		return "", nil, err
	}
	if err := waitLeaders(kc, name, parts); err != nil {
		_ = admin.DeleteTopic(name)
		admin.Close()
		return "", nil, err
	}
	return name, func() { _ = admin.DeleteTopic(name); admin.Close() }, nil
}

// waitLeaders waits until every partition of a new topic has a leader in the metadata: the
// topic is listed (with all its partitions) before that, and a produce or offset request
// sent then fails with NOT_LEADER_OR_FOLLOWER (seen in runs that start with a rate, when
// nothing ran on the topic before).
func waitLeaders(kc kafkax.Config, topic string, parts int32) error {
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	client, err := sarama.NewClient(kc.Brokers, sc)
	if err != nil {
		return kafkax.Unreachable(kc.Brokers, err)
	}
	defer client.Close()
	var last error
	for range 100 {
		last = client.RefreshMetadata(topic)
		for p := int32(0); last == nil && p < parts; p++ {
			if _, last = client.Leader(topic, p); last == nil {
				_, last = client.GetOffset(topic, p, sarama.OffsetNewest)
			}
		}
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("topic %s: partitions without a leader after 10 s: %w", topic, last)
}

// positionsTopic names a positions topic of the bench's own (the relay creates it, compacted)
// and returns a func that deletes it, to call once the relay is closed. Each relay of the
// bench starts with a fresh transactional id, and a relay with a new id reads its positions
// partition from the oldest record (no earlier batch of its own to stop at): on the shared
// topic, which every bench run added ≈25,000 records to, that start grew from ≈1.2 to ≈4 s
// over a morning of runs, and took CPU from the measurement.
func positionsTopic(kc kafkax.Config) (string, func()) {
	name := fmt.Sprintf("bench-positions-%d", time.Now().UnixNano())
	return name, func() {
		sc := sarama.NewConfig()
		sc.Version = kafkax.Version
		if admin, err := sarama.NewClusterAdmin(kc.Brokers, sc); err == nil {
			_ = admin.DeleteTopic(name)
			admin.Close()
		}
	}
}

// benchE2E: order-paid in → coupon-granted visible to a read_committed consumer, through
// the Watermill router, the inbox and the exactly-once relay, all in this process. Mode
// "batch" is the router's default (parallel subscriber, group commit); "single" is
// watermill-kafka's one-at-a-time subscriber and one delivery per transaction.
// e2eResult is what one benchE2E run measured: preloaded throughput, and p50/p99 per load.
type e2eResult struct {
	ordersPerS float64
	steadyPerS float64            // from the first finished delivery (the router's start left out)
	lat        map[int][3]float64 // p50, p99, achieved orders/s
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func benchE2E(ctx context.Context, db *sql.DB, kc kafkax.Config, mode string, n int, loadList string) (e2eResult, error) {
	res := e2eResult{lat: map[int][3]float64{}}
	if err := truncate(ctx); err != nil {
		return res, err
	}
	in, cleanIn, err := makeTopic(kc, "bench-order-paid", int32(*e2eParts))
	if err != nil {
		return res, err
	}
	defer cleanIn()
	out, cleanOut, err := makeTopic(kc, "bench-granted", int32(*e2eParts))
	if err != nil {
		return res, err
	}
	defer cleanOut()
	g, _, err := granter(ctx, db, out)
	if err != nil {
		return res, err
	}
	defer g.Close() // after the pipeline stops (deferred later, runs first)
	wake := &waker{}
	ib, err := inbox.New(db, g, inbox.Config{BizType: coupon.BizType, StepsPerTx: *e2eSPT}, nil, wake)
	if err != nil {
		return res, err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return res, err
	}
	defer producer.Close()

	// Throughput: pre-load the topic, then start the router and time the drain until a
	// read_committed consumer has seen every order's event.
	if err := produceOrders(producer, in, "e2e", 0, n, 0); err != nil {
		return res, err
	}
	w0, err := watch(kc, out)
	if err != nil {
		return res, err
	}
	stop, err := startPipeline(ctx, db, kc, in, ib, mode, wake)
	if err != nil {
		w0.close()
		return res, err
	}
	cpu := newCPUMeter()
	start := time.Now()
	firstDelivered.Store(0)
	err = w0.wait(n, 5*time.Minute)
	el := time.Since(start)

	w0.close()
	if err == nil {
		err = checkGranted(ctx, db, n)
	}
	if err != nil {
		stop()
		return res, err
	}
	res.ordersPerS = float64(n) / el.Seconds()
	// The router's start (consumer group join, first fetch; ≈0.2–0.3 s) is inside el:
	// steady_orders_per_s runs from the first delivery the inbox finished instead.
	startMs := float64(firstDelivered.Load()-start.UnixNano()) / 1e6
	res.steadyPerS = float64(n) / (el.Seconds() - startMs/1000)
	report("e2e", "mode", mode, "orders_per_s", res.ordersPerS, "orders", n, "offered", "preloaded",
		"start_ms", startMs, "steady_orders_per_s", res.steadyPerS)
	report("e2e_cpu", append([]any{"mode", mode}, cpu.perOrder(n)...)...)

	// Latency at offered loads: Kafka timestamp of the order (taken by this process's producer)
	// → this process's live read_committed consumer sees its CouponGranted event. Each load
	// first runs -warmup-seconds unmeasured (steady state: the throughput run's aftermath,
	// e.g. MariaDB purging its undo, is not charged to the first load).
	base, granted := n, n
	for _, rate := range splitInts(loadList) {
		count, warm := rate**loadSecs, rate**warmSecs
		w, err := watch(kc, out)
		if err != nil {
			stop()
			return res, err
		}
		if err := produceOrders(producer, in, "warm", base, warm, float64(rate)); err != nil {
			stop()
			return res, err
		}
		t0, lcpu := time.Now(), newCPUMeter()
		if err := produceOrders(producer, in, "lat", base, count, float64(rate)); err != nil {
			stop()
			return res, err
		}
		err = w.wait(warm+count, 5*time.Minute)
		achieved := float64(count) / time.Since(t0).Seconds()
		// CPU per order at this load (the measured orders and the warm-up's tail): at low
		// loads it is several times the full-load figure — per request, per transaction.
		lcpuKV := lcpu.perOrder(count)
		w.close()
		granted += warm + count
		if err == nil {
			err = checkGranted(ctx, db, granted)
		}
		if err != nil {
			stop()
			return res, err
		}
		p50, p99, measured, err := latencies(kc, in, w, "lat", base, base+count)
		if err != nil {
			stop()
			return res, err
		}
		res.lat[rate] = [3]float64{p50, p99, achieved}
		report("e2e", "mode", mode, "offered_per_s", rate, "orders_per_s", achieved, "p50_ms", p50, "p99_ms", p99, "measured", measured)
		report("e2e_cpu", append([]any{"mode", mode, "offered_per_s", rate}, lcpuKV...)...)
		if err := stages(ctx, kc, in, db, w, rate, base, base+count); err != nil {
			stop()
			return res, err
		}
		base += count
	}
	stop()
	return res, nil
}

func splitInts(s string) []int {
	var out []int
	cur := 0
	has := false
	for _, c := range s + "," {
		if c >= '0' && c <= '9' {
			cur = cur*10 + int(c-'0')
			has = true
		} else if has {
			out = append(out, cur)
			cur, has = 0, false
		}
	}
	return out
}

// produceOrders sends orders from..from+n to topic: as fast as possible when rate is 0, else
// at rate orders/s — every 5 ms the orders then due go in one request (as a producer's
// linger would batch them), each stamped with the time it was due, so the wait is part of
// its measured latency. (One request per order cost the shared broker more CPU than the
// orders did.)
func produceOrders(p sarama.SyncProducer, topic, prefix string, from, n int, rate float64) error {
	msg := func(i int) *sarama.ProducerMessage {
		o := order(prefix, i)
		return &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(o.Encode()),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}}
	}
	if rate <= 0 {
		var batch []*sarama.ProducerMessage
		for i := from; i < from+n; i++ {
			if batch = append(batch, msg(i)); len(batch) >= 500 {
				if err := p.SendMessages(batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			return p.SendMessages(batch)
		}
		return nil
	}
	const tick = 5 * time.Millisecond
	start := time.Now()
	i := from
	for next := start.Add(tick); i < from+n; next = next.Add(tick) {
		time.Sleep(time.Until(next))
		// Everything due by now goes: after a slow request the generator catches up at once
		// (sending one tick's orders per request, it had fallen behind for good whenever a
		// request took longer than a tick, and measured its own lag as the pipeline's).
		upTo := time.Now()
		if upTo.Before(next) {
			upTo = next
		}
		next = upTo
		var batch []*sarama.ProducerMessage
		for ; i < from+n; i++ {
			due := start.Add(time.Duration(float64(i-from+1) / rate * float64(time.Second)))
			if due.After(upTo) {
				break
			}
			m := msg(i)
			m.Timestamp = due
			batch = append(batch, m)
		}
		if len(batch) > 0 {
			if err := p.SendMessages(batch); err != nil {
				return err
			}
			now := time.Now()
			for _, m := range batch {
				producedAt.Store(string(m.Key.(sarama.StringEncoder)), now)
			}
		}
	}
	return nil
}

// waker wakes the pipeline's relay after every delivery that committed work, as the
// router does.
type waker struct{ relay atomic.Pointer[outbox.Relay] }

// firstDelivered is when the pipeline first finished a delivery (Unix ns; 0 until then).
var firstDelivered atomic.Int64

func (w *waker) Delivered(_ string, r inbox.Result, _ time.Duration) {
	firstDelivered.CompareAndSwap(0, time.Now().UnixNano())
	if rl := w.relay.Load(); rl != nil && r.Outcome == inbox.OutcomeProcessed {
		rl.Wake()
	}
}

func startPipeline(ctx context.Context, db *sql.DB, kc kafkax.Config, topic string, ib *inbox.Inbox, mode string, wake *waker) (func(), error) {
	var sub message.Subscriber
	var err error
	handler := ib.HandlerFunc(topic)
	closeBatcher := func() {}
	if mode == "batch" {
		sub, err = kc.NewParallelSubscriber("bench-"+topic, kafkax.ParallelConfig{}, watermill.NopLogger{})
		if err != nil {
			return nil, err
		}
		b, err := ib.NewBatcher(inbox.BatchConfig{MaxSize: *batchSize, Workers: *batchLanes, Linger: *batchLinger})
		if err != nil {
			return nil, err
		}
		handler, closeBatcher = b.HandlerFunc(topic), func() {
			_ = b.Close()
			// Deliveries the batches did not finish ran one at a time: a diagnosis line.
			st := b.Stats()
			report("e2e_batches", "batches", st.Batches, "avg_batch", float64(st.Batched)/float64(max(st.Batches, 1)),
				"fallbacks", st.Fallbacks, "rollbacks", st.Rollbacks)
		}
	} else if sub, err = kc.NewSubscriber("bench-"+topic, watermill.NopLogger{}); err != nil {
		return nil, err
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	producedAt.Clear()
	if *latencyDump != "" {
		// -latency-dump splits Kafka → inbox claim at the moment the subscriber hands an order
		// to the handler (the decode costs CPU, so only when asked).
		handedAt.Clear()
		inner := handler
		handler = func(msg *message.Message) error {
			var o struct {
				OrderID string `json:"orderId"`
			}
			if json.Unmarshal(msg.Payload, &o) == nil {
				handedAt.LoadOrStore(o.OrderID, time.Now())
			}
			return inner(msg)
		}
	}
	r.AddConsumerHandler("bench", topic, sub, handler)
	// The router's default relay: exactly once (transactional producer, positions, lease),
	// with configs/router.yaml's batch size and linger, woken after each committed delivery.
	positions, dropPositions := positionsTopic(kc)
	relay, err := outbox.NewExactlyOnceRelay(db, kc, outbox.RelayConfig{Shards: *e2eShards, Shard: "e2e",
		BatchSize: 2000, Linger: *e2eLinger, PositionsTopic: positions,
		TransactionalID: fmt.Sprintf("bench-e2e-%d", time.Now().UnixNano())}, nil)
	if err != nil {
		return nil, err
	}
	wake.relay.Store(relay)
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = r.Run(cctx) }()
	go func() { defer wg.Done(); _ = relay.Run(cctx) }()
	<-r.Running()
	return func() { cancel(); wg.Wait(); closeBatcher(); _ = relay.Close(); dropPositions() }, nil
}

// When the producer's request with each order of a latency run returned (the broker has
// it), and, with -latency-dump, when each order was first handed to the handler.
var producedAt, handedAt sync.Map

// checkGranted confirms, once a run's events were all seen, that the database agrees: want
// grants and nothing left unpublished. (Runs wait on the watcher, not on this query: polled,
// its index scans took a sizeable share of the 2 cores the pipeline runs on.)
func checkGranted(ctx context.Context, db *sql.DB, want int) error {
	var granted, pending int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM coupon_grant WHERE state = 'GRANTED'), (SELECT COUNT(*) FROM outbox WHERE published_at IS NULL)").Scan(&granted, &pending); err != nil {
		return err
	}
	if granted != want || pending != 0 {
		return fmt.Errorf("all events seen, but the database has %d grants (want %d) and %d unpublished events", granted, want, pending)
	}
	return nil
}

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

func writeCSV() error {
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	stamp := time.Now().UTC().Format("20060102-150405")
	png := filepath.Join(*outDir, "bench-"+stamp+".png")
	if err := writeChart(png, chartPanels()); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	// The latest full run's chart under a stable name, for README (-only runs leave it).
	if *only == "" {
		if err := writeChart(filepath.Join(*outDir, "latest.png"), chartPanels()); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	fmt.Printf("bench: chart written to %s\n", png)
	path := filepath.Join(*outDir, "bench-"+stamp+".csv")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"name", "key", "value"})
	for _, r := range results {
		for _, kv := range r.fields {
			_ = w.Write([]string{r.name, kv[0], kv[1]})
		}
	}
	w.Flush()
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("bench: results written to %s\n", path)
	return w.Error()
}

// stages splits the latency of orders from..to into where it was spent, from clocks on this
// host: the order's Kafka timestamp (this process's producer), the inbox row's created_at
// (the router's claim, MariaDB's clock), the outbox row's created_at (the handler wrote the
// event, same transaction) and the moment the live read_committed consumer saw the event.
// The rows' created_at is when the statement ran, before the transaction commits.
func stages(ctx context.Context, kc kafkax.Config, in string, db *sql.DB, w *watcher, rate, from, to int) error {
	ins, err := readTimestamps(kc, in)
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
	if *latencyDump != "" {
		f, err := os.Create(fmt.Sprintf("%s-%d.csv", *latencyDump, rate))
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
			if v, ok := producedAt.Load(id); ok {
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
				_ = dump.Write([]string{id, f(ms(t0.Sub(ins[order("lat", from).OrderID]))), f(since(&producedAt)), f(since(&handedAt)), f(ms(t1.Sub(t0))), f(ms(t2.Sub(t1))), f(ms(t3.Sub(t2))), f(ms(t3.Sub(t0))), strconv.FormatInt(t0.UnixMilli(), 10)})
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
	report("e2e_stages", "offered_per_s", rate, "produce_p50_ms", p(produced, 50), "produce_p99_ms", p(produced, 99),
		"kafka_to_inbox_p50_ms", p(toInbox, 50), "kafka_to_inbox_p99_ms", p(toInbox, 99),
		"inbox_to_outbox_p50_ms", p(toOutbox, 50), "inbox_to_outbox_p99_ms", p(toOutbox, 99),
		"outbox_to_visible_p50_ms", p(toVisible, 50), "outbox_to_visible_p99_ms", p(toVisible, 99))
	return nil
}

package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// The lean group measures the floor the hot path's targets are set against: a batch-native
// exactly-once pipeline on the same services, input and coupon plugin as the router group's
// peak run, in a process of its own (this binary with -lean-child), so its CPU is counted
// as the router binary's is. Per poll of up to -lean-batch records:
//
//   - one database transaction claims the records' keys in the inbox with multi-row
//     INSERT IGNORE … RETURNING (the same columns and prepared statement sizes as the
//     Batcher's claim; the row records the topic, partition and offset that claimed it),
//     reads back which record holds each key the insert skipped, runs the coupon plugin's
//     HandleBatch on the new keys and commits;
//   - one Kafka transaction (franz-go's GroupTransactSession) carries a CouponGranted event
//     for every key a record of the poll claimed, and the poll's consumer offsets with the
//     group's member id and generation (KIP-447).
//
// A record whose key it claimed in an earlier, aborted attempt finds its own topic,
// partition and offset on the row and sends its event again; a copy finds another
// record's and sends nothing. The events are built from the orders as the plugin builds
// them (the design takes them from memory); the plugin's outbox rows are written as the
// router writes them and left for no relay. It runs on MariaDB only.
//
// What it leaves out of the router's promises: per-key order across polls beyond Kafka's,
// slow Prepare calls, poison and quarantine, delayed redelivery, the breaker, memory
// bounded by bytes, events written outside a consumed record. So it is the floor, not a
// design to ship.

// leanGroup runs the lean pipeline as the router group runs the router binary: at its peak
// on -router-orders pre-loaded orders (leanPeak), then paced at -router-rate orders/s
// (leanAtRate). Either is left out when its flag is 0.
func (s *suite) leanGroup(ctx context.Context) error {
	if s.dialect.IsPostgres() { // its claim is MariaDB's INSERT IGNORE … RETURNING
		fmt.Println("bench: lean: MariaDB only, not run on this -dsn")
		return nil
	}
	if s.cfg.routerN > 0 {
		if err := s.leanPeak(ctx); err != nil {
			return err
		}
	}
	if s.cfg.routerRate > 0 {
		return s.leanAtRate(ctx)
	}
	return nil
}

// startLean starts the lean pipeline as a child process (this binary with -lean-child) on
// topics in and out in consumer group group, waiting gap between each poll's database
// commit and its Kafka transaction; profile names its CPU profile ("" takes none).
func (s *suite) startLean(in, out, group string, gap time.Duration, profile string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-lean-child", strings.Join([]string{in, out, group}, ","), "-dsn", s.cfg.appDSN,
		"-brokers", s.cfg.brokers, "-lean-batch", fmt.Sprint(s.cfg.leanBatch), "-lean-gap", gap.String())
	// Of -router-env, only the fetch settings apply to it too (leanFetchEnv): GOGC and the
	// like stay the router's.
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "ONCEFLOW_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	for _, e := range strings.Split(s.cfg.routerEnv, ",") {
		if strings.HasPrefix(e, "ONCEFLOW_KAFKA_FETCH_MIN_BYTES=") || strings.HasPrefix(e, "ONCEFLOW_KAFKA_MAX_POLL_WAIT=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	if profile != "" {
		cmd.Args = append(cmd.Args, "-cpuprofile", profile)
	}
	c, err := startChild(cmd, "bench-lean", func() {})
	if err == nil {
		fmt.Printf("bench: lean pipeline started (pid %d, log %s)\n", cmd.Process.Pid, c.logPath)
	}
	return c, err
}

// leanPeak runs the lean pipeline on -router-orders pre-loaded orders (-dup-pct of them
// delivered twice) and reports its CPU per order beside MariaDB's and Kafka's, then checks
// every order was granted once and its event seen once.
func (s *suite) leanPeak(ctx context.Context) error {
	n := s.cfg.routerN
	in, out, clean, err := s.leanTopics(ctx)
	if err != nil {
		return err
	}
	defer clean()
	deliveries, err := s.loadPeerInput(in, n)
	if err != nil {
		return err
	}
	w, err := watch(s.kc, out)
	if err != nil {
		return err
	}
	defer w.close()
	group := "bench-lean-" + in
	defer s.dropGroup(group)
	cpu := newCPUMeter(s.services)
	delete(cpu.pids, "bench") // the bench only watches
	start := time.Now()
	// -lean-kills: SIGKILL it that many times while it works, each time starting it again,
	// to check its exactly-once claim (the CPU figures then count only the last process).
	// These runs wait leanGap between each poll's database commit and its Kafka transaction,
	// so that about half the kills land there.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 54))
	for range s.cfg.leanKills {
		c, err := s.startLean(in, out, group, leanGap, "")
		if err != nil {
			return err
		}
		// while it works: once it has sent events, at some point of a poll
		if err := c.waitSeen(w, min(w.count()+1, n), 2*time.Minute); err != nil {
			return err
		}
		time.Sleep(time.Duration(rng.Int64N(int64(3 * leanGap))))
		_ = c.cmd.Process.Kill()
		<-c.exited
		c.samplerWG.Wait()
	}
	c, err := s.startLean(in, out, group, 0, s.cfg.leanProfile)
	if err != nil {
		return err
	}
	defer c.stop()
	cpu.pids["lean"], cpu.start["lean"] = c.pidStr(), 0 // from its start
	if err := c.waitSeen(w, n, 10*time.Minute); err != nil {
		return err
	}
	el := time.Since(start)
	kv := cpu.perOrder(n)
	hwm := c.hwmMB()
	if err := c.stop(); err != nil {
		return err
	}
	if err := s.checkLean(ctx, out, n); err != nil {
		return err
	}
	s.report("lean", append([]any{"mode", "peak", "orders_per_s", float64(n) / el.Seconds(), "orders", n, "deliveries", deliveries,
		"max_rss_mb", hwm, "batch", s.cfg.leanBatch, "kills", s.cfg.leanKills}, kv...)...)
	return nil
}

// leanTopics empties the bench tables, creates a lean run's topics (routerTopics) and its
// campaign; the returned func deletes the topics.
func (s *suite) leanTopics(ctx context.Context) (in, out string, clean func(), err error) {
	if in, out, clean, err = s.routerTopics(ctx); err != nil {
		return "", "", nil, err
	}
	if _, _, err := s.granter(ctx, out); err != nil {
		clean()
		return "", "", nil, err
	}
	return in, out, clean, nil
}

// checkLean checks a lean run: n orders granted, each order's event on topic out once.
func (s *suite) checkLean(ctx context.Context, out string, n int) error {
	var granted int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM coupon_grant WHERE state = 'GRANTED'").Scan(&granted); err != nil {
		return err
	}
	recs, err := s.kc.ReadAll(ctx, out, 2*time.Second)
	if err != nil {
		return err
	}
	keys := map[string]bool{}
	for _, r := range recs {
		keys[string(r.Key)] = true
	}
	if granted != n || len(keys) != n || len(recs) != n {
		return fmt.Errorf("lean: %d grants, %d events of %d orders (want %d of each, each once)", granted, len(recs), len(keys), n)
	}
	return nil
}

// leanAtRate paces the lean pipeline as routerAtRate paces the router binary: fresh topics
// and consumer group, -router-rate orders/s from the e2e generator once the group is
// stable, -warmup-seconds unmeasured, then -router-seconds measured. It reports p50 / p99
// (an order's due time → its event seen by a read_committed consumer) and the CPU per
// order, as the router's rate line, and checks every order was granted and its event seen
// once. The lean child fetches as the router does by default (kafka.fetch_min_bytes,
// kafka.max_poll_wait), so the two lines differ by the pipeline alone.
func (s *suite) leanAtRate(ctx context.Context) error {
	rate := s.cfg.routerRate
	in, out, clean, err := s.leanTopics(ctx)
	if err != nil {
		return err
	}
	defer clean()
	w, err := watch(s.kc, out)
	if err != nil {
		return err
	}
	defer w.close()
	producer, err := s.kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	group := "bench-lean-" + in
	defer s.dropGroup(group)
	c, err := s.startLean(in, out, group, 0, "")
	if err != nil {
		return err
	}
	defer c.stop()
	if err := waitGroupStable(s.kc, group, 2*time.Minute, c); err != nil {
		return err
	}
	r, err := s.pace(producer, c, w, in, "lean", "lwarm", "llat")
	if err != nil {
		return err
	}
	if err := s.checkLean(ctx, out, r.warm+r.count); err != nil {
		return err
	}
	p50, p99, _, err := latencies(s.kc, in, w, "llat", 0, r.count)
	if err != nil {
		return err
	}
	s.report("lean", append([]any{"mode", fmt.Sprintf("rate%d", rate), "offered_per_s", rate, "orders_per_s", r.achieved,
		"max_rss_mb", r.hwm, "orders", r.count, "seconds", s.cfg.routerSecs, "p50_ms", p50, "p99_ms", p99,
		"batch", s.cfg.leanBatch}, r.kv...)...)
	return nil
}

// leanGap is the wait between a poll's database commit and its Kafka transaction in the
// runs -lean-kills ends.
const leanGap = 200 * time.Millisecond

// leanClaimWidth is the parameters of one row of the lean claim (leanClaim).
const leanClaimWidth = 9

// leanClaim is the lean claim of n rows: the Batcher's columns, the row done at once (the
// claim commits with the handler's rows), returning the keys it inserted.
func leanClaim(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT IGNORE INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset,
 payload, fingerprint, attempts, expire_at, tombstone) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, 'done', ?, ?, ?, ?, ?, ?, 1, ?, FALSE)")
	}
	b.WriteString(" RETURNING dedup_key")
	return b.String()
}

// leanPipeline is the lean group's child process: the database side and the Kafka session.
type leanPipeline struct {
	db     *sql.DB
	h      inbox.BatchHandler
	claim  *dbx.MultiRow
	cfg    coupon.Config
	out    string
	retain time.Duration
}

// leanItem is one record of a poll.
type leanItem struct {
	rec   *kgo.Record
	order coupon.OrderPaid
	uuid  string
}

// runLeanChild runs the lean pipeline until SIGTERM (-lean-child in,out,group).
func runLeanChild(cfg *config) error {
	parts := strings.Split(cfg.leanChild, ",")
	if len(parts) != 3 {
		return fmt.Errorf("-lean-child %q: want in,out,group", cfg.leanChild)
	}
	in, out, group := parts[0], parts[1], parts[2]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	db, err := dbx.Open(ctx, dbx.Config{DSN: cfg.appDSN, MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer db.Close()
	ccfg := coupon.DefaultConfig()
	ccfg.GrantedTopic, ccfg.FailedTopic = out, out
	g, err := coupon.NewGranter(ccfg, nil, nil)
	if err != nil {
		return err
	}
	h, err := g.Handler(db)
	if err != nil {
		return err
	}
	bh, ok := h.(inbox.BatchHandler)
	if !ok {
		return errors.New("lean: the coupon handler has no HandleBatch")
	}
	p := &leanPipeline{db: db, h: bh, cfg: ccfg, out: out, retain: 7 * 24 * time.Hour,
		claim: dbx.NewMultiRow(db, leanClaimWidth, 256, leanClaim)}
	defer p.claim.Close()
	s := newSuite(cfg)
	if err := leanFetchEnv(&s.kc); err != nil {
		return err
	}
	sess, err := kgo.NewGroupTransactSession(s.kgoOpts(s.kgoGroupOpts(group, in),
		kgoTxnOpts("lean", out), []kgo.Opt{kgo.FetchMaxBytes(64 << 20), kgo.FetchMinBytes(int32(s.kc.FetchMinBytes))})...)
	if err != nil {
		return err
	}
	defer sess.Close()
	var pe produceErrs
	for {
		fs := sess.PollRecords(ctx, cfg.leanBatch)
		if ctx.Err() != nil {
			return nil
		}
		if err := fs.Err0(); err != nil {
			return err
		}
		if fs.NumRecords() == 0 {
			continue
		}
		events, err := p.batch(ctx, fs.Records())
		if err != nil {
			return err
		}
		time.Sleep(cfg.leanGap)
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		for _, e := range events {
			sess.Produce(ctx, e, pe.promise)
		}
		// Aborted (a rebalance, a refused event): the records are read again, and those
		// that claimed their keys in this poll send their events again.
		if _, err := sess.End(ctx, kgo.TryCommit); err != nil || pe.err() != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("end transaction: %w", errors.Join(err, pe.err()))
		}
	}
}

// leanFetchEnv sets kc's fetch settings from the router's environment variables for them,
// ONCEFLOW_KAFKA_FETCH_MIN_BYTES and ONCEFLOW_KAFKA_MAX_POLL_WAIT, where set: the lean
// pipeline then fetches as a router given the same -router-env.
func leanFetchEnv(kc *kafkax.Config) error {
	if v, ok := os.LookupEnv("ONCEFLOW_KAFKA_FETCH_MIN_BYTES"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("lean: ONCEFLOW_KAFKA_FETCH_MIN_BYTES=%q: want a positive number of bytes", v)
		}
		kc.FetchMinBytes = n
	}
	if v, ok := os.LookupEnv("ONCEFLOW_KAFKA_MAX_POLL_WAIT"); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("lean: ONCEFLOW_KAFKA_MAX_POLL_WAIT=%q: want a positive duration", v)
		}
		kc.MaxPollWait = d
	}
	return nil
}

// batch runs one poll's database transaction and returns the events to send for it.
func (p *leanPipeline) batch(ctx context.Context, recs []*kgo.Record) ([]*kgo.Record, error) {
	items := make([]leanItem, 0, len(recs))
	for _, r := range recs {
		o, err := coupon.DecodeOrderPaid(r.Value)
		if err != nil {
			return nil, fmt.Errorf("%s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
		}
		it := leanItem{rec: r, order: o}
		for _, h := range r.Headers {
			if h.Key == wkafka.UUIDHeaderKey {
				it.uuid = string(h.Value)
			}
		}
		items = append(items, it)
	}
	var send []leanItem
	err := dbx.InTx(ctx, p.db, func(tx *sql.Tx) error {
		var err error
		send, err = p.claimAndGrant(ctx, tx, items)
		return err
	})
	if err != nil {
		return nil, err
	}
	events := make([]*kgo.Record, len(send))
	now := time.Now().UTC()
	for i, it := range send {
		o := it.order
		ev := coupon.GrantEvent{EventID: coupon.EventID(coupon.EventGranted, o.OrderID, p.cfg.CampaignID), OrderID: o.OrderID, UserID: o.UserID,
			CampaignID: p.cfg.CampaignID, CouponID: coupon.CouponID(o.OrderID, p.cfg.CampaignID), ValueCents: p.cfg.ValueCents, GrantedAt: now}
		events[i] = &kgo.Record{Topic: p.out, Key: []byte(o.OrderID), Value: ev.Encode(), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderEventID, Value: []byte(ev.EventID)}, {Key: outbox.HeaderEventType, Value: []byte(coupon.EventGranted)}}}
	}
	return events, nil
}

// claimAndGrant claims items' keys in tx, grants the new ones and returns the items whose
// events go out: those whose record holds its key's row.
func (p *leanPipeline) claimAndGrant(ctx context.Context, tx *sql.Tx, items []leanItem) ([]leanItem, error) {
	expire := time.Now().Add(p.retain)
	args := make([]any, 0, len(items)*leanClaimWidth)
	for _, it := range items {
		sum := sha256.Sum256(it.rec.Value)
		args = append(args, it.order.OrderID, coupon.BizType, it.uuid, it.rec.Topic, it.rec.Partition, it.rec.Offset,
			it.rec.Value, hex.EncodeToString(sum[:]), expire)
	}
	fresh := make(map[string]bool, len(items))
	if err := p.claim.Query(ctx, tx, args, func(rows *sql.Rows) error {
		var k string
		if err := rows.Scan(&k); err != nil {
			return err
		}
		fresh[k] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	// The keys the insert skipped: a copy, or this record's own claim of an aborted attempt.
	var taken []any
	for _, it := range items {
		if !fresh[it.order.OrderID] {
			taken = append(taken, it.order.OrderID)
		}
	}
	type claimer struct {
		topic     string
		partition int32
		offset    int64
	}
	holders := map[string]claimer{}
	if len(taken) > 0 {
		q := "SELECT dedup_key, topic, kafka_partition, kafka_offset FROM inbox WHERE biz_type = ? AND dedup_key IN (?" + strings.Repeat(", ?", len(taken)-1) + ")"
		rows, err := tx.QueryContext(ctx, q, append([]any{coupon.BizType}, taken...)...)
		if err != nil {
			return nil, fmt.Errorf("claimers: %w", err)
		}
		for rows.Next() {
			var k string
			var c claimer
			if err := rows.Scan(&k, &c.topic, &c.partition, &c.offset); err != nil {
				rows.Close()
				return nil, err
			}
			holders[k] = c
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return nil, err
		}
	}
	var send []leanItem
	var ds []*inbox.Delivery
	for _, it := range items {
		k := it.order.OrderID
		switch {
		case fresh[k]:
			delete(fresh, k) // a second record of the key in this poll is a copy
			send = append(send, it)
			ds = append(ds, &inbox.Delivery{Message: message.NewMessage(it.uuid, it.rec.Value), BizType: coupon.BizType, Key: k, Value: it.order, Attempt: 1})
		case holders[k] == claimer{it.rec.Topic, it.rec.Partition, it.rec.Offset}:
			send = append(send, it) // granted by this record in an attempt whose events were aborted
		}
	}
	if len(ds) == 0 {
		return send, nil
	}
	slices.SortFunc(ds, func(a, b *inbox.Delivery) int { return strings.Compare(a.Key, b.Key) })
	progs, err := p.h.HandleBatch(ctx, tx, ds)
	if err != nil {
		return nil, err
	}
	for _, pr := range progs {
		if pr != inbox.Done {
			return nil, errors.New("lean: the batch left a grant unfinished")
		}
	}
	return send, nil
}

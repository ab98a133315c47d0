package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/outbox"
)

// The "plain" group: a plugin written only with the plain inbox.Handler API — one INSERT
// into its own table and one outbox event per order, no batch code — one delivery per
// transaction (Inbox.Process, mode=single) and group-committed by the Batcher (each
// delivery's Handle in the batch's transaction, behind a savepoint once a delivery has
// failed: inbox/grouped.go), its INSERT sent by tx.ExecContext (mode=grouped) or through an
// inbox.Inserter, which defers it to the batch's multi-row INSERT (mode=grouped_inserter);
// beside them the coupon plugin on the same Batcher settings, through its hand-written
// BatchHandler (mode=coupon_batch, the router's) and through only the contract a plugin
// author writes, its HandleBatch left out (mode=coupon_plain). Rounds alternate the order
// of the modes (-plain-modes); medians reported, then the ratios.

// plainTable is the plain plugin's own table, created by the bench on its database (not a
// framework migration): one credit per order.
const plainTable = `CREATE TABLE IF NOT EXISTS plain_credit (
 id BIGINT AUTO_INCREMENT PRIMARY KEY,
 order_id VARCHAR(64) NOT NULL,
 user_id VARCHAR(64) NOT NULL,
 points BIGINT NOT NULL,
 created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
 UNIQUE KEY uk_order (order_id)
) ENGINE=InnoDB`

// plainCredit is the plain plugin: what a user writes with the inbox.Handler API. With ins
// set (mode=grouped_inserter) it writes its credit through an inbox.Inserter instead of
// tx.ExecContext: the same row, deferred to the end of a group-committed batch.
type plainCredit struct {
	out *outbox.Writer
	ins *inbox.Inserter
}

var _ inbox.Handler = (*plainCredit)(nil)

type plainOrder struct {
	OrderID     string `json:"orderId"`
	UserID      string `json:"userId"`
	AmountCents int64  `json:"amountCents"`
}

func (plainCredit) Decode(m *message.Message) (inbox.Decoded, error) {
	var o plainOrder
	if err := json.Unmarshal(m.Payload, &o); err != nil {
		return inbox.Decoded{}, inbox.PoisonError("order-paid: %v", err)
	}
	if o.OrderID == "" || o.UserID == "" {
		return inbox.Decoded{}, inbox.PoisonError("order-paid: orderId and userId are required")
	}
	return inbox.Decoded{Key: o.OrderID, Value: o}, nil
}

func (h plainCredit) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	o, ok := d.Value.(plainOrder)
	if !ok {
		return inbox.Done, inbox.Permanent(fmt.Errorf("unexpected value %T", d.Value))
	}
	points := o.AmountCents / 100
	if h.ins != nil {
		if err := h.ins.Insert(ctx, tx, o.OrderID, o.UserID, points); err != nil {
			return inbox.Done, fmt.Errorf("credit %s: %w", o.OrderID, err)
		}
	} else if _, err := tx.ExecContext(ctx, "INSERT INTO plain_credit (order_id, user_id, points) VALUES (?, ?, ?)", o.OrderID, o.UserID, points); err != nil {
		return inbox.Done, fmt.Errorf("credit %s: %w", o.OrderID, err)
	}
	payload := fmt.Appendf(nil, `{"orderId":%q,"userId":%q,"points":%d}`, o.OrderID, o.UserID, points)
	// A stable event id (derived from the order), as the outbox wants: a retried delivery
	// writes the same event.
	id := uuid.NewSHA1(uuid.NameSpaceOID, []byte("PointsCredited\x00"+o.OrderID)).String()
	err := h.out.Add(ctx, tx, outbox.Event{ID: id, Type: "PointsCredited", Topic: "bench-unrelayed-points", Key: o.OrderID, Payload: payload})
	return inbox.Done, err
}

// truncatePlain empties what the plain measurements write.
func (s *suite) truncatePlain(ctx context.Context) error {
	if err := s.truncate(ctx); err != nil {
		return err
	}
	_, err := s.lock.ExecContext(ctx, "TRUNCATE TABLE plain_credit")
	return err
}

// checkPlain confirms one credit and one event per order, nothing else.
func checkPlain(ctx context.Context, db *sql.DB, n int) error {
	var credits, events, done int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM plain_credit), (SELECT COUNT(*) FROM outbox), (SELECT COUNT(*) FROM inbox WHERE status = 'done')").Scan(&credits, &events, &done); err != nil {
		return err
	}
	if credits != n || events != n || done != n {
		return fmt.Errorf("plain: %d credits, %d events, %d done inbox rows; want %d each", credits, events, done, n)
	}
	return nil
}

// newPlainInbox builds the plain plugin's inbox; inserter: its credit through an
// inbox.Inserter.
func newPlainInbox(db *sql.DB, inserter bool) (*engine.Inbox, *outbox.Writer, error) {
	out, err := outbox.NewWriter("outbox")
	if err != nil {
		return nil, nil, err
	}
	h := plainCredit{out: out}
	if inserter {
		if h.ins, err = inbox.NewInserter("plain_credit", "order_id", "user_id", "points"); err != nil {
			return nil, nil, err
		}
	}
	ib, err := engine.New(db, h, engine.Config{BizType: "plain"}, nil, nil)
	return ib, out, err
}

// plainMeasure is one measurement of a round: orders/s and CPU per order by role.
type plainMeasure struct {
	rate float64
	cpu  map[string]float64
}

func cpuMap(kv []any) map[string]float64 {
	m := map[string]float64{}
	for i := 0; i+1 < len(kv); i += 2 {
		if f, ok := kv[i+1].(float64); ok {
			m[kv[i].(string)] = f
		}
	}
	return m
}

// benchPlainSingle: every order through Inbox.Process, one delivery per transaction, from
// -workers concurrent workers, then 30 % duplicates.
func (s *suite) benchPlainSingle(ctx context.Context) (plainMeasure, error) {
	if err := s.truncatePlain(ctx); err != nil {
		return plainMeasure{}, err
	}
	ib, out, err := newPlainInbox(s.db, false)
	if err != nil {
		return plainMeasure{}, err
	}
	defer out.Close()
	n := s.cfg.plainSingle
	send := func(i int) error {
		_, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), order("plain-single", i).Encode()), inbox.Source{Topic: "bench"}, engine.ProcessOptions{})
		return err
	}
	cpu := newCPUMeter(s.services)
	el, err := s.parallel(n, send)
	if err != nil {
		return plainMeasure{}, err
	}
	kv := cpu.perOrder(n)
	rate := float64(n) / el.Seconds()
	dups := n * 3 / 10
	del, err := s.parallel(dups, func(i int) error { return send(i * 3) })
	if err != nil {
		return plainMeasure{}, err
	}
	if err := checkPlain(ctx, s.db, n); err != nil {
		return plainMeasure{}, err
	}
	s.report("plain", append([]any{"mode", "single", "orders_per_s", rate, "orders", n, "workers", s.workers, "duplicates_per_s", float64(dups) / del.Seconds()}, kv...)...)
	return plainMeasure{rate: rate, cpu: cpuMap(kv)}, nil
}

// benchPlainGrouped: every order through a Batcher on the plain handler (group commit),
// offered by -batch-senders concurrent senders exactly as benchInboxBatch offers the coupon
// orders, then 30 % duplicates; inserter: the handler writes its credit through an
// inbox.Inserter (mode=grouped_inserter).
func (s *suite) benchPlainGrouped(ctx context.Context, inserter bool) (plainMeasure, error) {
	if err := s.truncatePlain(ctx); err != nil {
		return plainMeasure{}, err
	}
	ib, out, err := newPlainInbox(s.db, inserter)
	if err != nil {
		return plainMeasure{}, err
	}
	defer out.Close()
	b, err := ib.NewBatcher(s.batchConfig())
	if err != nil {
		return plainMeasure{}, err
	}
	defer b.Close()
	mode := "grouped"
	if inserter {
		mode = "grouped_inserter"
	}
	return s.measureBatcher(ctx, b, mode, "plain-"+mode, func() error { return checkPlain(ctx, s.db, s.cfg.batchOrders) })
}

// benchPlainCoupon: the coupon plugin through the same Batcher settings and senders, its
// BatchHandler (mode=coupon_batch, the reference of the ratios) or, contract, only the
// contract a plugin author writes (mode=coupon_plain).
func (s *suite) benchPlainCoupon(ctx context.Context, contract bool) (plainMeasure, error) {
	if err := s.truncatePlain(ctx); err != nil {
		return plainMeasure{}, err
	}
	b, _, closeBatcher, err := s.newBatcher(ctx, contract)
	if err != nil {
		return plainMeasure{}, err
	}
	defer closeBatcher()
	mode := "coupon_batch"
	if contract {
		mode = "coupon_plain"
	}
	return s.measureBatcher(ctx, b, mode, "plain-"+mode, func() error {
		var granted int
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM coupon_grant WHERE state = 'GRANTED'").Scan(&granted); err != nil {
			return err
		}
		if granted != s.cfg.batchOrders {
			return fmt.Errorf("coupon batch: %d grants, want %d", granted, s.cfg.batchOrders)
		}
		return nil
	})
}

// measureBatcher offers -batch-orders orders to b from -batch-senders senders (timed, with
// CPU per order), then 30 % duplicates, checks the result and reports the line.
func (s *suite) measureBatcher(ctx context.Context, b *engine.Batcher, mode, prefix string, check func() error) (plainMeasure, error) {
	n := s.cfg.batchOrders
	defer s.withWorkers(s.cfg.batchSenders)()
	send := func(i int) error {
		_, err := b.Process(ctx, message.NewMessage(watermill.NewUUID(), order(prefix, i).Encode()), inbox.Source{Topic: "bench"})
		return err
	}
	cpu := newCPUMeter(s.services)
	el, err := s.parallel(n, send)
	if err != nil {
		return plainMeasure{}, err
	}
	kv := cpu.perOrder(n)
	rate := float64(n) / el.Seconds()
	dups := n * 3 / 10
	del, err := s.parallel(dups, func(i int) error { return send(i * 3) })
	if err != nil {
		return plainMeasure{}, err
	}
	if err := check(); err != nil {
		return plainMeasure{}, err
	}
	st := b.Stats()
	s.report("plain", append([]any{"mode", mode, "orders_per_s", rate, "orders", n, "batch_size", s.cfg.batchSize, "duplicates_per_s", float64(dups) / del.Seconds(),
		"avg_batch", float64(st.Batched) / float64(max(st.Batches, 1)), "fallbacks", st.Fallbacks, "isolated", st.Isolated, "rollbacks", st.Rollbacks}, kv...)...)
	return plainMeasure{rate: rate, cpu: cpuMap(kv)}, nil
}

// benchSavepointCost times the statements group commit adds per delivery of a plain
// handler, each alone in one transaction of plainSavepoints statements on one connection:
// SAVEPOINT with one reused name (what the Batcher sends), SAVEPOINT + RELEASE SAVEPOINT
// (what it does not), and for scale the plain handler's INSERT.
func (s *suite) benchSavepointCost(ctx context.Context) error {
	if err := s.truncatePlain(ctx); err != nil {
		return err
	}
	const n = 20000
	kinds := []struct {
		name  string
		stmts func(tx *sql.Tx, i int) error
	}{
		{"savepoint", func(tx *sql.Tx, _ int) error {
			_, err := tx.ExecContext(ctx, "SAVEPOINT onceflow_delivery")
			return err
		}},
		{"savepoint_release", func(tx *sql.Tx, _ int) error {
			if _, err := tx.ExecContext(ctx, "SAVEPOINT onceflow_delivery"); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT onceflow_delivery")
			return err
		}},
		{"insert", func(tx *sql.Tx, i int) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO plain_credit (order_id, user_id, points) VALUES (?, ?, ?)", fmt.Sprintf("sp-%07d", i), "u", 19)
			return err
		}},
	}
	kv := []any{"mode", "savepoint_cost", "statements", n}
	for _, k := range kinds {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		cpu := newCPUMeter(s.services)
		start := time.Now()
		for i := range n {
			if err := k.stmts(tx, i); err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("%s: %w", k.name, err)
			}
		}
		el := time.Since(start)
		c := cpuMap(cpu.perOrder(n))
		if err := tx.Rollback(); err != nil {
			return err
		}
		kv = append(kv, k.name+"_us", float64(el.Microseconds())/n, k.name+"_cpu_us", c["total_cpu_us_per_order"])
	}
	s.report("plain", kv...)
	return nil
}

// plainGroup runs the group: the savepoint costs, then -plain-rounds rounds of the
// measurements -plain-modes names, their medians and the ratios.
func (s *suite) plainGroup(ctx context.Context) error {
	if _, err := s.lock.ExecContext(ctx, plainTable); err != nil {
		return fmt.Errorf("create plain_credit: %w", err)
	}
	if err := s.grantOwn(ctx, "plain_credit"); err != nil {
		return err
	}
	if s.cfg.plainWants("savepoint_cost") {
		if err := s.benchSavepointCost(ctx); err != nil {
			return fmt.Errorf("savepoint cost: %w", err)
		}
	}
	var modes []struct {
		name string
		run  func(context.Context) (plainMeasure, error)
	}
	for _, m := range []struct {
		name string
		run  func(context.Context) (plainMeasure, error)
	}{{"single", s.benchPlainSingle},
		{"grouped", func(ctx context.Context) (plainMeasure, error) { return s.benchPlainGrouped(ctx, false) }},
		{"grouped_inserter", func(ctx context.Context) (plainMeasure, error) { return s.benchPlainGrouped(ctx, true) }},
		{"coupon_batch", func(ctx context.Context) (plainMeasure, error) { return s.benchPlainCoupon(ctx, false) }},
		{"coupon_plain", func(ctx context.Context) (plainMeasure, error) { return s.benchPlainCoupon(ctx, true) }}} {
		if s.cfg.plainWants(m.name) {
			modes = append(modes, m)
		}
	}
	got := map[string][]plainMeasure{}
	for r := 1; r <= s.cfg.plainRounds; r++ {
		s.round = r
		seq := slices.Clone(modes)
		if r%2 == 0 {
			slices.Reverse(seq)
		}
		for _, m := range seq {
			res, err := m.run(ctx)
			if err != nil {
				return fmt.Errorf("plain %s: %w", m.name, err)
			}
			got[m.name] = append(got[m.name], res)
		}
	}
	s.round = 0
	med := map[string]float64{}
	for _, m := range modes {
		ms := got[m.name]
		rates := make([]float64, len(ms))
		for i, x := range ms {
			rates[i] = x.rate
		}
		med[m.name] = median(rates)
		kv := []any{"mode", m.name, "orders_per_s", med[m.name], "min", slices.Min(rates), "max", slices.Max(rates), "rounds", len(ms)}
		for _, role := range []string{"db", "kafka", "bench", "total"} {
			key := role + "_cpu_us_per_order"
			var vs []float64
			for _, x := range ms {
				if v, ok := x.cpu[key]; ok {
					vs = append(vs, v)
				}
			}
			if len(vs) > 0 {
				kv = append(kv, key, median(vs))
			}
		}
		s.report("plain", kv...)
	}
	ratio := func(a, b float64) string { return fmt.Sprintf("%.2f", a/max(b, 1)) }
	var kv []any
	for _, r := range []struct{ name, a, b string }{
		{"plain_grouped_vs_single", "grouped", "single"}, {"plain_grouped_vs_coupon_batch", "grouped", "coupon_batch"},
		{"plain_inserter_vs_single", "grouped_inserter", "single"}, {"plain_inserter_vs_coupon_batch", "grouped_inserter", "coupon_batch"},
		{"coupon_batch_vs_plain", "coupon_batch", "coupon_plain"},
	} {
		if _, ok := med[r.a]; ok {
			if _, ok := med[r.b]; ok {
				kv = append(kv, r.name, ratio(med[r.a], med[r.b]))
			}
		}
	}
	if len(kv) > 0 {
		s.report("ratio", kv...)
	}
	// The coupon plugin's two paths, round by round (the modes of a round ran back to back).
	if cb, cp := got["coupon_batch"], got["coupon_plain"]; len(cb) > 0 && len(cb) == len(cp) {
		var rs []float64
		for i := range cb {
			rs = append(rs, cb[i].rate/max(cp[i].rate, 1))
		}
		s.report("ratio", "mode", "coupon_batch_vs_plain_by_round", "median", median(rs), "min", slices.Min(rs), "max", slices.Max(rs), "rounds", len(rs))
	}
	return nil
}

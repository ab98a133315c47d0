package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// rowsGroup prices the coupon plugin's rows per order in the database, to weigh the lever
// "fewer rows per order": its batch writes per order one grant, three transition-log rows
// (INIT → LOCKED → BUDGET_DEDUCTED → GRANTED), one coupon and one outbox event beside the
// inbox's row. Each mode inserts -rows-orders orders' rows of one table alone, in
// transactions of 512 orders on two connections, with the batch's statements (multi-row,
// server-side prepared, as coupon's batchStatements): grant, log3 (today's three log rows),
// log1 (one log row per order, INIT → GRANTED), coupon. -db-rounds rounds in rotated order,
// each on emptied tables; MariaDB's CPU µs per order, ending once it is idle (waitPurge).
// The ratio line is what a one-row log, or none, would save per order.
//
// Four more modes price the inbox's own row the same way, as the Batcher's claim writes it
// (an upsert of the row already 'done', read back with RETURNING; the statements of
// inbox/batch.go: insertColumns, claimGroup, claimRows): "inbox", a new row; "inbox_dup",
// the same claim on rows that exist (a copy turned away: the rows are claimed once first,
// untimed); "inbox_noindex", a new row in a copy of the table without its secondary index
// (idx_biz_status_created); "inbox_key", a row of only the unique key (id, dedup_key,
// biz_type, duplicates) claimed by the same upsert and read back: what any durable dedup
// record costs. The rows_inbox ratio line splits a new row's cost into the key, the secondary
// index and the other columns (message id, source, payload, metadata, fingerprint, status,
// attempts, expiry), which the inbox overhead's target has to fit in. The claim's text is
// copied here (the inbox package does not export it): change both together.
func (s *suite) rowsGroup(ctx context.Context) error {
	if err := s.rowsTables(ctx, true); err != nil {
		return err
	}
	defer func() { _ = s.rowsTables(context.Background(), false) }()
	modes := []string{"grant", "log3", "log1", "coupon", "inbox", "inbox_dup", "inbox_noindex", "inbox_key"}
	cpu, rate := map[string][]float64{}, map[string][]float64{}
	for r := range s.cfg.dbRounds {
		for i := range modes {
			mode := modes[(r+i)%len(modes)]
			perS, dbCPU, err := s.rowsRun(ctx, mode)
			if err != nil {
				return fmt.Errorf("rows %s: %w", mode, err)
			}
			cpu[mode], rate[mode] = append(cpu[mode], dbCPU), append(rate[mode], perS)
			s.report("rows", "round", r, "mode", mode, "orders_per_s", perS, "db_cpu_us_per_order", dbCPU)
		}
	}
	for _, mode := range modes {
		s.report("rows", "mode", mode, "orders", s.cfg.rowsOrders, "orders_per_s", median(rate[mode]), "db_cpu_us_per_order", median(cpu[mode]),
			"db_cpu_min", slices.Min(cpu[mode]), "db_cpu_max", slices.Max(cpu[mode]), "rounds", s.cfg.dbRounds)
	}
	all := median(cpu["grant"]) + median(cpu["log3"]) + median(cpu["coupon"])
	s.report("ratio", "mode", "rows_log", "plugin_rows_db_cpu_us_per_order", all, "log3_db_cpu_us_per_order", median(cpu["log3"]),
		"log1_saving_db_cpu_us_per_order", median(cpu["log3"])-median(cpu["log1"]), "nolog_saving_db_cpu_us_per_order", median(cpu["log3"]))
	row, key, noIndex := median(cpu["inbox"]), median(cpu["inbox_key"]), median(cpu["inbox_noindex"])
	s.report("ratio", "mode", "rows_inbox", "row_db_cpu_us", row, "key_db_cpu_us", key, "index_db_cpu_us", row-noIndex,
		"columns_db_cpu_us", noIndex-key, "dup_db_cpu_us", median(cpu["inbox_dup"]))
	return nil
}

// The rows group's tables beside the inbox: a copy without its secondary index, and a table
// of only the unique key (inbox_noindex, inbox_key).
const (
	rowsNoIndexTable = "bench_inbox_noindex"
	rowsKeyTable     = "bench_inbox_key"
)

// rowsTables creates the rows group's tables afresh (create) or drops them.
func (s *suite) rowsTables(ctx context.Context, create bool) error {
	stmts := []string{"DROP TABLE IF EXISTS " + rowsNoIndexTable, "DROP TABLE IF EXISTS " + rowsKeyTable}
	if create {
		stmts = append(stmts, "CREATE TABLE "+rowsNoIndexTable+" LIKE inbox",
			"ALTER TABLE "+rowsNoIndexTable+" DROP KEY idx_biz_status_created",
			"CREATE TABLE "+rowsKeyTable+` (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    dedup_key  VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    biz_type   VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    duplicates INT NOT NULL DEFAULT 0,
    UNIQUE KEY uk_dedup (dedup_key, biz_type)
) ENGINE=InnoDB`)
	}
	for _, q := range stmts {
		if _, err := s.lock.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("rows: %s: %w", strings.Fields(q)[0], err)
		}
	}
	if create {
		for _, t := range []string{rowsNoIndexTable, rowsKeyTable} {
			if err := s.grantOwn(ctx, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// rowsClaim is the Batcher's claim of new inbox rows into table (inbox/batch.go): the row
// written 'done', an existing one locked and counted as a duplicate, every row read back.
func rowsClaim(table string) (head, group, tail string) {
	return "INSERT INTO " + table + ` (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset,
 payload, metadata, fingerprint, attempts, last_error, replay_id, expire_at, tombstone, payload_size) VALUES `,
		"(?, ?, 'done', NULL, ?, ?, ?, ?, ?, ?, ?, 1, NULL, NULL, ?, FALSE, NULL)",
		" ON DUPLICATE KEY UPDATE duplicates = duplicates + 1 RETURNING id, dedup_key, status, fingerprint, reason, duplicates"
}

// rowsRun inserts the rows of mode for -rows-orders orders and returns orders/s and MariaDB's
// CPU µs per order.
func (s *suite) rowsRun(ctx context.Context, mode string) (float64, float64, error) {
	if err := s.truncate(ctx); err != nil {
		return 0, 0, err
	}
	switch mode { // the group's own tables, emptied before MariaDB settles too
	case "inbox_noindex":
		if err := s.rowsEmpty(ctx, rowsNoIndexTable); err != nil {
			return 0, 0, err
		}
	case "inbox_key":
		if err := s.rowsEmpty(ctx, rowsKeyTable); err != nil {
			return 0, 0, err
		}
	}
	if err := s.waitPurge(ctx); err != nil {
		return 0, 0, err
	}
	const per = 512
	campaign := coupon.DefaultConfig().CampaignID
	var st *dbx.MultiRow
	var width, rowsPer int
	var rowArgs func(o coupon.OrderPaid, args []any) []any
	returning := false // the statement reads its rows back (the inbox's claim)
	multi := func(w, max int, head, group string) *dbx.MultiRow {
		return dbx.NewMultiRow(s.db, w, max, func(n int) string {
			return head + strings.TrimSuffix(strings.Repeat(group+", ", n), ", ")
		})
	}
	switch mode {
	case "inbox", "inbox_dup", "inbox_noindex":
		table := "inbox"
		if mode == "inbox_noindex" {
			table = rowsNoIndexTable
		}
		head, group, tail := rowsClaim(table)
		width, rowsPer, returning = 10, 1, true
		// The claim's largest statement is 256 rows (inbox's claimRows).
		st = dbx.NewMultiRow(s.db, width, 256, func(n int) string {
			return head + strings.TrimSuffix(strings.Repeat(group+", ", n), ", ") + tail
		})
		expire := time.Now().Add(720 * time.Hour).UTC()
		// What the router stores of an order-paid record with a trace context.
		meta := `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`
		rowArgs = func(o coupon.OrderPaid, args []any) []any {
			return append(args, o.OrderID, coupon.BizType, watermill.NewUUID(), "order-paid", int32(3), int64(len(args)/width),
				o.Encode(), meta, o.Fingerprint(), expire)
		}
	case "inbox_key":
		// The same upsert and read-back (a dedup record must tell a new row from a copy).
		width, rowsPer, returning = 2, 1, true
		st = dbx.NewMultiRow(s.db, width, 256, func(n int) string {
			return "INSERT INTO " + rowsKeyTable + " (dedup_key, biz_type) VALUES " + strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ") +
				" ON DUPLICATE KEY UPDATE duplicates = duplicates + 1 RETURNING id, duplicates"
		})
		rowArgs = func(o coupon.OrderPaid, args []any) []any { return append(args, o.OrderID, coupon.BizType) }
	case "grant":
		width, rowsPer = 7, 1
		st = multi(width, per, `INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, version, value_cents, stock_shard, budget_shard, coupon_id) VALUES `,
			"(?, ?, ?, 'GRANTED', 3, ?, ?, ?, ?)")
		rowArgs = func(o coupon.OrderPaid, args []any) []any {
			return append(args, o.OrderID, campaign, o.UserID, 500, 0, 0, coupon.CouponID(o.OrderID, campaign))
		}
	case "log3", "log1":
		width, rowsPer = 4, 3
		if mode == "log1" {
			rowsPer = 1
		}
		st = multi(width, per*rowsPer, `INSERT INTO coupon_grant_log (order_id, campaign_id, from_state, to_state) VALUES `, "(?, ?, ?, ?)")
		steps := [][2]string{{"INIT", "LOCKED"}, {"LOCKED", "BUDGET_DEDUCTED"}, {"BUDGET_DEDUCTED", "GRANTED"}}
		if rowsPer == 1 {
			steps = [][2]string{{"INIT", "GRANTED"}}
		}
		rowArgs = func(o coupon.OrderPaid, args []any) []any {
			for _, step := range steps {
				args = append(args, o.OrderID, campaign, step[0], step[1])
			}
			return args
		}
	case "coupon":
		width, rowsPer = 5, 1
		st = multi(width, per, `INSERT INTO user_coupon (coupon_id, order_id, campaign_id, user_id, value_cents) VALUES `, "(?, ?, ?, ?, ?)")
		rowArgs = func(o coupon.OrderPaid, args []any) []any {
			return append(args, coupon.CouponID(o.OrderID, campaign), o.OrderID, campaign, o.UserID, 500)
		}
	default:
		return 0, 0, fmt.Errorf("unknown mode %q", mode)
	}
	defer st.Close()
	// Every mode starts with its statements prepared (outside the timed part).
	if err := st.Prepare(ctx); err != nil {
		return 0, 0, err
	}
	n := s.cfg.rowsOrders
	batches := (n + per - 1) / per
	restore := s.withWorkers(2)
	defer restore()
	run := func(b int) error {
		args := make([]any, 0, per*rowsPer*width)
		for i := b * per; i < min((b+1)*per, n); i++ {
			args = rowArgs(order("rows", i), args)
		}
		return dbx.InTx(ctx, s.db, func(tx *sql.Tx) error {
			if returning {
				return st.Query(ctx, tx, args, func(*sql.Rows) error { return nil })
			}
			_, err := st.Exec(ctx, tx, args)
			return err
		})
	}
	if mode == "inbox_dup" {
		// The rows the copies meet, claimed first, untimed.
		if _, err := s.parallel(batches, run); err != nil {
			return 0, 0, err
		}
		if err := s.waitPurge(ctx); err != nil {
			return 0, 0, err
		}
	}
	meter := newCPUMeter(s.services)
	el, err := s.parallel(batches, run)
	if err != nil {
		return 0, 0, err
	}
	if err := s.waitPurge(ctx); err != nil {
		return 0, 0, err
	}
	return float64(n) / el.Seconds(), dbCPUPerOrder(meter, n), nil
}

// rowsEmpty empties one of the rows group's own tables (truncate empties the framework's).
func (s *suite) rowsEmpty(ctx context.Context, table string) error {
	if _, err := s.lock.ExecContext(ctx, "TRUNCATE TABLE "+table); err != nil {
		return fmt.Errorf("rows: truncate %s: %w", table, err)
	}
	return nil
}

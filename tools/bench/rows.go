package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

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
func (s *suite) rowsGroup(ctx context.Context) error {
	modes := []string{"grant", "log3", "log1", "coupon"}
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
	return nil
}

// rowsRun inserts the rows of mode for -rows-orders orders and returns orders/s and MariaDB's
// CPU µs per order.
func (s *suite) rowsRun(ctx context.Context, mode string) (float64, float64, error) {
	if err := s.truncate(ctx); err != nil {
		return 0, 0, err
	}
	if err := s.waitPurge(ctx); err != nil {
		return 0, 0, err
	}
	const per = 512
	campaign := coupon.DefaultConfig().CampaignID
	var st *dbx.MultiRow
	var width, rowsPer int
	var rowArgs func(o coupon.OrderPaid, args []any) []any
	multi := func(w, max int, head, group string) *dbx.MultiRow {
		return dbx.NewMultiRow(s.db, w, max, func(n int) string {
			return head + strings.TrimSuffix(strings.Repeat(group+", ", n), ", ")
		})
	}
	switch mode {
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
	n := s.cfg.rowsOrders
	batches := (n + per - 1) / per
	restore := s.withWorkers(2)
	defer restore()
	meter := newCPUMeter(s.services)
	el, err := s.parallel(batches, func(b int) error {
		args := make([]any, 0, per*rowsPer*width)
		for i := b * per; i < min((b+1)*per, n); i++ {
			args = rowArgs(order("rows", i), args)
		}
		return dbx.InTx(ctx, s.db, func(tx *sql.Tx) error {
			_, err := st.Exec(ctx, tx, args)
			return err
		})
	})
	if err != nil {
		return 0, 0, err
	}
	if err := s.waitPurge(ctx); err != nil {
		return 0, 0, err
	}
	return float64(n) / el.Seconds(), dbCPUPerOrder(meter, n), nil
}

package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// databasesGroup measures the inbox in-process (group commit, no Kafka: benchInboxBatch) and
// the pipeline end to end (benchE2E, preloaded) on MariaDB (-dsn) and on PostgreSQL
// (-pg-dsn) in the same run: -db-rounds rounds, each running both databases back to back,
// alternating which goes first, with each server's CPU per order. Reported per database as
// db_compare lines (medians of the rounds) and PostgreSQL's end-to-end rate in per cent of
// MariaDB's (each round's, then their median).
func (s *suite) databasesGroup(ctx context.Context) error {
	pcfg := *s.cfg
	pcfg.adminDSN, pcfg.appDSN = s.cfg.pgAdminDSN, s.cfg.pgDSN
	ps := newSuite(&pcfg)
	ps.services = findServices(&pcfg)
	if err := ps.openDB(ctx); err != nil {
		return fmt.Errorf("postgres: %w (scripts/infra.sh up starts it)", err)
	}
	defer ps.db.Close()
	if !ps.dialect.IsPostgres() {
		return fmt.Errorf("-pg-dsn %s is not a PostgreSQL DSN", dbx.MaskDSN(s.cfg.pgDSN))
	}
	fmt.Printf("bench: PostgreSQL CPU from its postmaster pid %s and its backends\n", ps.services["db"])
	type figures struct{ inbox, inboxCPU, e2e, e2eCPU []float64 }
	got := map[string]*figures{"mariadb": {}, "postgres": {}}
	suites := map[string]*suite{"mariadb": s, "postgres": ps}
	var ratios []float64
	for r := 1; r <= s.cfg.dbRounds; r++ {
		order := []string{"mariadb", "postgres"}
		if r%2 == 0 {
			slices.Reverse(order)
		}
		e2e := map[string]float64{}
		for _, name := range order {
			x, f := suites[name], got[name]
			x.round = r
			ib, err := x.benchInboxBatch(ctx)
			if err != nil {
				return fmt.Errorf("%s inbox: %w", name, err)
			}
			res, err := x.benchE2E(ctx, "batch", false, s.cfg.dbE2EOrders, "")
			if err != nil {
				return fmt.Errorf("%s e2e: %w", name, err)
			}
			x.round = 0
			f.inbox, f.inboxCPU = append(f.inbox, ib.rate), append(f.inboxCPU, ib.dbCPU)
			f.e2e, f.e2eCPU = append(f.e2e, res.ordersPerS), append(f.e2eCPU, res.dbCPU)
			e2e[name] = res.ordersPerS
			s.report("db_compare", "round", r, "db", name, "inbox_orders_per_s", ib.rate, "inbox_db_cpu_us_per_order", ib.dbCPU,
				"e2e_orders_per_s", res.ordersPerS, "e2e_db_cpu_us_per_order", res.dbCPU)
		}
		ratios = append(ratios, 100*e2e["postgres"]/max(e2e["mariadb"], 1))
	}
	for _, name := range []string{"mariadb", "postgres"} {
		f := got[name]
		s.report("db_compare", "db", name, "inbox_orders_per_s", median(f.inbox), "inbox_db_cpu_us_per_order", median(f.inboxCPU),
			"e2e_orders_per_s", median(f.e2e), "e2e_min", slices.Min(f.e2e), "e2e_max", slices.Max(f.e2e),
			"e2e_db_cpu_us_per_order", median(f.e2eCPU), "rounds", s.cfg.dbRounds)
	}
	s.report("ratio", "mode", "postgres_vs_mariadb_e2e", "median_pct", median(ratios), "min_pct", slices.Min(ratios), "max_pct", slices.Max(ratios), "rounds", len(ratios))
	return nil
}

package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// relayDBGroup measures the relay's database work per event without Kafka, to price the
// lever "delete rows by position instead of marking them published": the same 50,000
// outbox rows (-relay-events) read in the relay's batches (its pending SELECT, every column, by
// id) and then
//
//   - mark: the exactly-once relay's mark (UPDATE … SET published_at WHERE id BETWEEN …
//     AND published_at IS NULL), followed by the retention sweep that deletes every
//     published row a week later (its DELETE … WHERE published_at < … LIMIT, timed
//     apart: sweep_db_cpu_us_per_event) — what a row costs the relay today;
//   - delete: the batch's rows deleted by their ids instead, nothing left to sweep;
//   - select_only: nothing written back (the next read starts after the last id): the
//     floor, what the pending read alone costs.
//
// -db-rounds rounds, each running the three modes in a rotated order; each run starts on an
// emptied table and ends once InnoDB's purge has caught up (its history list is short), so
// the purge of updated and deleted rows is counted where it happens. MariaDB's CPU per event
// (db_cpu_us_per_event) is the figure; events_per_s is the read-and-write loop's rate.
func (s *suite) relayDBGroup(ctx context.Context) error {
	modes := []string{"mark", "delete", "select_only"}
	cpu := map[string][]float64{}
	sweep, rate := map[string][]float64{}, map[string][]float64{}
	for r := range s.cfg.dbRounds {
		for i := range modes {
			mode := modes[(r+i)%len(modes)]
			m, err := s.relayDBRun(ctx, mode)
			if err != nil {
				return fmt.Errorf("relay_db %s: %w", mode, err)
			}
			cpu[mode], sweep[mode], rate[mode] = append(cpu[mode], m.dbCPU), append(sweep[mode], m.sweepCPU), append(rate[mode], m.perS)
			s.report("relay_db", "round", r, "mode", mode, "events_per_s", m.perS, "db_cpu_us_per_event", m.dbCPU, "sweep_db_cpu_us_per_event", m.sweepCPU)
		}
	}
	for _, mode := range modes {
		s.report("relay_db", "mode", mode, "events", s.cfg.relayN, "batch", s.cfg.relayBatch, "events_per_s", median(rate[mode]),
			"db_cpu_us_per_event", median(cpu[mode]), "db_cpu_min", slices.Min(cpu[mode]), "db_cpu_max", slices.Max(cpu[mode]),
			"sweep_db_cpu_us_per_event", median(sweep[mode]), "rounds", s.cfg.dbRounds)
	}
	today := median(cpu["mark"]) + median(sweep["mark"])
	s.report("ratio", "mode", "relay_db_delete_vs_mark", "mark_and_sweep_db_cpu_us_per_event", today,
		"delete_db_cpu_us_per_event", median(cpu["delete"]), "saving_db_cpu_us_per_event", today-median(cpu["delete"]),
		"select_db_cpu_us_per_event", median(cpu["select_only"]))
	return nil
}

type relayDBMeasure struct{ perS, dbCPU, sweepCPU float64 }

// relayDBRun fills the outbox with -relay-n rows and reads them back in the relay's batches,
// treating each batch as mode says.
func (s *suite) relayDBRun(ctx context.Context, mode string) (relayDBMeasure, error) {
	db, n := s.db, s.cfg.relayN
	if err := s.truncate(ctx); err != nil {
		return relayDBMeasure{}, err
	}
	if err := fillOutbox(ctx, db, "bench-relay-db", n); err != nil {
		return relayDBMeasure{}, err
	}
	if err := s.waitPurge(ctx); err != nil {
		return relayDBMeasure{}, err
	}
	const cols = `SELECT id, event_id, event_type, topic, msg_key, payload, headers, trace_parent FROM outbox WHERE published_at IS NULL`
	read, readAfter := cols+` ORDER BY id LIMIT ?`, cols+` AND id > ? ORDER BY id LIMIT ?`
	cpu := newCPUMeter(s.services)
	start := time.Now()
	last, seen := int64(0), 0
	for seen < n {
		var rows *sql.Rows
		var err error
		if mode == "select_only" {
			rows, err = db.QueryContext(ctx, readAfter, last, s.cfg.relayBatch)
		} else {
			rows, err = db.QueryContext(ctx, read, s.cfg.relayBatch)
		}
		if err != nil {
			return relayDBMeasure{}, err
		}
		first, got := int64(-1), 0
		for rows.Next() {
			var id int64
			var eventID, typ, topic, key string
			var payload []byte
			var headers, trace sql.NullString
			if err := rows.Scan(&id, &eventID, &typ, &topic, &key, &payload, &headers, &trace); err != nil {
				rows.Close()
				return relayDBMeasure{}, err
			}
			if first < 0 {
				first = id
			}
			last, got = id, got+1
		}
		if err := rows.Err(); err != nil {
			return relayDBMeasure{}, err
		}
		rows.Close()
		if got == 0 {
			return relayDBMeasure{}, fmt.Errorf("%d of %d rows read, then none", seen, n)
		}
		seen += got
		switch mode {
		case "mark":
			_, err = db.ExecContext(ctx, `UPDATE outbox SET published_at = NOW(6) WHERE (id BETWEEN ? AND ?) AND published_at IS NULL`, first, last)
		case "delete":
			_, err = db.ExecContext(ctx, `DELETE FROM outbox WHERE id BETWEEN ? AND ?`, first, last)
		}
		if err != nil {
			return relayDBMeasure{}, err
		}
	}
	el := time.Since(start)
	if err := s.waitPurge(ctx); err != nil {
		return relayDBMeasure{}, err
	}
	m := relayDBMeasure{perS: float64(n) / el.Seconds(), dbCPU: dbCPUPerOrder(cpu, n)}
	if mode == "mark" {
		// The retention sweep of the same rows, as the relay's cleaner runs it (its default
		// batch of 500 rows per DELETE), with the cutoff in the future.
		sw := newCPUMeter(s.services)
		for {
			res, err := db.ExecContext(ctx, `DELETE FROM outbox WHERE published_at < NOW(6) + INTERVAL 1 DAY LIMIT 500`)
			if err != nil {
				return relayDBMeasure{}, err
			}
			if k, _ := res.RowsAffected(); k == 0 {
				break
			}
		}
		if err := s.waitPurge(ctx); err != nil {
			return relayDBMeasure{}, err
		}
		m.sweepCPU = dbCPUPerOrder(sw, n)
	}
	return m, nil
}

// dbCPUPerOrder is the database server's CPU µs per order (event) since m started.
func dbCPUPerOrder(m *cpuMeter, n int) float64 {
	kv := m.perOrder(n)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "db_cpu_us_per_order" {
			return kv[i+1].(float64)
		}
	}
	return -1
}

// waitPurge waits until the database server is idle — under 1 % of a core in each of three
// seconds in a row, at most 60 s — so the purge of what a run updated or deleted (InnoDB's
// background threads, which work through a large history at a few per cent of a core)
// counts in that run's CPU, not the next's. (Its history length would say so directly,
// but reading it takes the PROCESS privilege.)
func (s *suite) waitPurge(ctx context.Context) error {
	pid := s.services["db"]
	if pid == "" {
		return fmt.Errorf("no database process found to wait for its purge")
	}
	deadline := time.Now().Add(60 * time.Second)
	for idle := 0; idle < 3 && time.Now().Before(deadline); {
		before := procCPU(pid)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		if procCPU(pid)-before < 10*time.Millisecond {
			idle++
		} else {
			idle = 0
		}
	}
	return nil
}

// fillOutbox commits n outbox rows of a small event to topic, 1,000 per transaction, keys
// cycling over 5,000.
func fillOutbox(ctx context.Context, db *sql.DB, topic string, n int) error {
	w, _ := outbox.NewWriter("outbox")
	payload := []byte(`{"eventId":"x","orderId":"o","userId":"u","campaignId":"c","couponId":"k","valueCents":500}`)
	for start := 0; start < n; start += 1000 {
		err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
			for i := start; i < min(start+1000, n); i++ {
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
	return nil
}

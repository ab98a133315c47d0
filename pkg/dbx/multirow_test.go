package dbx_test

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func TestMultiRowSizes(t *testing.T) {
	// 15 parameters a row: prepared statements of 256 down to 16 rows (240 parameters; 8
	// rows would be 120, under 128), the rest as one interpolated statement.
	m := dbx.NewMultiRow(nil, 15, 256, nil)
	if m.MinPrepared() != 16 {
		t.Errorf("MinPrepared for 15 parameters = %d, want 16", m.MinPrepared())
	}
	for n, want := range map[int][]int{
		0: nil, 1: {1}, 3: {3}, 15: {15}, 16: {16}, 31: {16, 15}, 256: {256}, 460: {256, 128, 64, 12}, 600: {256, 256, 64, 16, 8},
	} {
		if got := m.Sizes(n); !reflect.DeepEqual(got, want) {
			t.Errorf("Sizes(%d) = %v, want %v", n, got, want)
		}
	}
	if got := dbx.NewMultiRow(nil, 4, 2048, nil).MinPrepared(); got != 32 {
		t.Errorf("MinPrepared for 4 parameters = %d, want 32", got)
	}
	if got := dbx.NewMultiRow(nil, 2, 8, nil).MinPrepared(); got != 8 {
		t.Errorf("MinPrepared for 2 parameters, max 8 = %d, want 8 (at most Max)", got)
	}
	// The placeholder limit (65535) and powers of two bound the largest statement.
	if got := dbx.NewMultiRow(nil, 15, 10000, nil).Max(); got != 4096 {
		t.Errorf("Max for 15 parameters, asked 10000 = %d, want 4096", got)
	}
	if got := dbx.NewMultiRow(nil, 1, 100, nil).Max(); got != 64 {
		t.Errorf("Max for 1 parameter, asked 100 = %d, want 64", got)
	}
}

// TestMultiRow: rows go in order as the fewest statements, prepared once Prepare ran (the
// session's statement counters tell) and interpolated before; on a one-connection pool a
// transaction never waits for a second connection.
func TestMultiRow(t *testing.T) {
	d := testenv.DB(t, 1)
	d.AdminExec(t, "CREATE TABLE mr (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(32) NOT NULL UNIQUE, v BLOB NULL)")
	text := func(n int) string {
		return "INSERT INTO mr (k, v) VALUES " + strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ")
	}
	m := dbx.NewMultiRow(d.DB, 2, 8, func(n int) string { return text(n) + " RETURNING k" })
	defer m.Close()
	plain := dbx.NewMultiRow(d.DB, 2, 16, text)
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rows := func(prefix string, n int) []any {
		args := make([]any, 0, 2*n)
		for i := range n {
			args = append(args, fmt.Sprintf("%s-%02d", prefix, i), []byte{0, byte(i), '\''})
		}
		return args
	}
	// counters returns the session's prepared-statement executions and prepares.
	counters := func(tx *sql.Tx) (exec, prep int) {
		for name, dst := range map[string]*int{"Com_stmt_execute": &exec, "Com_stmt_prepare": &prep} {
			var k string
			if err := tx.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&k, dst); err != nil {
				t.Fatal(err)
			}
		}
		return exec, prep
	}
	run := func(prefix string, n int) (got []string, exec, prep int) {
		err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
			e0, p0 := counters(tx)
			if err := m.Query(ctx, tx, rows(prefix, n), func(r *sql.Rows) error {
				var k string
				got = append(got, k)
				return r.Scan(&got[len(got)-1])
			}); err != nil {
				return err
			}
			e1, p1 := counters(tx)
			exec, prep = e1-e0, p1-p0
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", prefix, err)
		}
		return got, exec, prep
	}
	want := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%02d", prefix, i))
		}
		return out
	}

	// Before Prepare: interpolated, no prepared statement, and no wait for a second connection.
	got, exec, _ := run("a", 13)
	if !reflect.DeepEqual(got, want("a", 13)) || exec != 0 {
		t.Fatalf("unprepared: rows %v, %d prepared executions (want 0)", got, exec)
	}
	// A Prepare waiting for a connection (the pool's only one is in a transaction) must not
	// hold up that transaction's statements: they run interpolated, the transaction ends, and
	// the Prepare gets the connection.
	tx, err := d.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	prepared := make(chan error, 1)
	go func() { prepared <- m.Prepare(ctx) }()
	time.Sleep(100 * time.Millisecond)
	if err := m.Query(ctx, tx, rows("w", 3), func(r *sql.Rows) error { var k string; return r.Scan(&k) }); err != nil {
		t.Fatalf("a statement in a transaction while Prepare waits for a connection: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-prepared; err != nil {
		t.Fatal(err)
	}
	// 21 rows = 8 + 8 prepared on this (only) connection, then 5 interpolated (fewer than
	// MinPrepared, 8 here): two prepared executions.
	got, exec, prep := run("b", 21)
	if !reflect.DeepEqual(got, want("b", 21)) || exec != 2 || prep != 0 {
		t.Fatalf("prepared: rows %v, %d executions (want 2), %d prepares (want 0)", got, exec, prep)
	}
	// Exec counts rows, interpolated and prepared; a duplicate key fails the whole call.
	for _, prefix := range []string{"c", "d"} {
		if prefix == "d" {
			if err := plain.Prepare(ctx); err != nil {
				t.Fatal(err)
			}
		}
		err = dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
			e0, _ := counters(tx)
			n, err := plain.Exec(ctx, tx, rows(prefix, 20))
			if err != nil || n != 20 {
				return fmt.Errorf("exec 20 rows: %d affected, %v", n, err)
			}
			if e1, _ := counters(tx); prefix == "d" && e1-e0 != 1 { // 16 prepared + 4 interpolated
				return fmt.Errorf("prepared exec of 20 rows: %d executions, want 1", e1-e0)
			}
			if _, err := plain.Exec(ctx, tx, rows(prefix, 1)); !dbx.IsDuplicate(err) {
				return fmt.Errorf("a duplicate row: err %v, want a duplicate-key error", err)
			}
			if _, err := plain.Exec(ctx, tx, []any{"odd"}); err == nil {
				return fmt.Errorf("1 parameter accepted as rows of 2")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", prefix, err)
		}
	}
	var total int
	var v []byte
	if err := d.DB.QueryRowContext(ctx, "SELECT COUNT(*), (SELECT v FROM mr WHERE k = 'b-12') FROM mr").Scan(&total, &v); err != nil {
		t.Fatal(err)
	}
	if total != 13+3+21+20+20 || string(v) != "\x00\x0c'" {
		t.Fatalf("%d rows (want 77), v=%q", total, v)
	}
}

// TestMultiRowPreparesItself: a MultiRow on a pool prepares its statements in the
// background after its first use, with no Prepare call: a later transaction runs them
// prepared. One pooled connection, so the first transaction holds it while the background
// Prepare waits for it (and must not wait for the Prepare).
func TestMultiRowPreparesItself(t *testing.T) {
	d := testenv.DB(t, 1)
	d.AdminExec(t, "CREATE TABLE mr (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(32) NOT NULL UNIQUE)")
	m := dbx.NewMultiRow(d.DB, 1, 256, func(n int) string {
		return "INSERT INTO mr (k) VALUES " + strings.TrimSuffix(strings.Repeat("(?), ", n), ", ")
	})
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	execs := func(tx *sql.Tx) int {
		var k string
		var n int
		if err := tx.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_execute'").Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	insert := func(round int) (prepared int) {
		err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
			args := make([]any, 128)
			for i := range args {
				args[i] = fmt.Sprintf("r%d-%03d", round, i)
			}
			before := execs(tx)
			if _, err := m.Exec(ctx, tx, args); err != nil {
				return err
			}
			prepared = execs(tx) - before
			return nil
		})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		return prepared
	}
	if n := insert(0); n != 0 {
		t.Fatalf("first use: %d prepared executions, want 0 (interpolated while it prepares)", n)
	}
	for round := 1; ; round++ {
		if n := insert(round); n == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the statements were never prepared")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

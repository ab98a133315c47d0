//go:build galera

package dbx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// The tests of this file run on the three-node Galera cluster of `scripts/infra.sh
// galera-up`, by make test-galera or `go test -tags galera ./pkg/dbx/`. They desynchronise
// and kill its nodes.

var galeraPorts = []string{"4306", "4307", "4308"}

const galeraUp = "bash scripts/infra.sh galera-up"

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// galera fails the test unless the three nodes answer.
func galera(t *testing.T) {
	t.Helper()
	testenv.Integration(t)
	for _, p := range galeraPorts {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+p, 2*time.Second)
		if err != nil {
			t.Fatalf("galera node 127.0.0.1:%s: %v: start the cluster with `%s`", p, err, galeraUp)
		}
		c.Close()
	}
}

func galeraDSN(user string, ports ...string) string {
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, "127.0.0.1:"+p)
	}
	return fmt.Sprintf("%s:%s@tcp(%s)/onceflow_test", user, user, strings.Join(addrs, ","))
}

// infra runs scripts/infra.sh with args, such as a node's start, kill or root SQL.
func infra(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"scripts/infra.sh"}, args...)...)
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("infra.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// rootSQL runs sql as root on node n, 1 to 3, through its socket.
func rootSQL(t *testing.T, n int, sql string) {
	t.Helper()
	sock := filepath.Join(repoRoot(t), ".run", "galera", fmt.Sprintf("node-%d", n), "mysqld.sock")
	if out, err := exec.Command("mariadb", "--protocol=socket", "-S", sock, "-uroot", "-e", sql).CombinedOutput(); err != nil {
		t.Fatalf("node %d: %s: %v\n%s", n, sql, err, out)
	}
}

func nodePort(t *testing.T, db *sql.DB) string {
	t.Helper()
	var port string
	if err := db.QueryRow("SELECT @@port").Scan(&port); err != nil {
		t.Fatal(err)
	}
	return port
}

// freshConn is the port a new connection of the pool reaches.
func freshConn(t *testing.T, db *sql.DB) string {
	t.Helper()
	db.SetMaxIdleConns(0)
	defer db.SetMaxIdleConns(1)
	return nodePort(t, db)
}

// New connections go to the first server of the DSN's list that answers and is Synced. A
// closed port and a desynchronised node are skipped. Connections stay on that server while
// it is Synced, even when an earlier one is back. The pool's sessions read causally, by
// wsrep_sync_wait.
func TestGaleraFailoverConnector(t *testing.T) {
	galera(t)
	ctx := context.Background()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, deadPort, _ := net.SplitHostPort(closed.Addr().String())
	closed.Close()

	db, err := dbx.Open(ctx, dbx.Config{DSN: galeraDSN("onceflow_admin", deadPort, "4307", "4306", "4308"), MaxOpenConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := freshConn(t, db); got != "4307" {
		t.Fatalf("first connection on port %s, want 4307 (the first server of the list that answers)", got)
	}
	var wait int
	if err := db.QueryRow("SELECT @@wsrep_sync_wait").Scan(&wait); err != nil || wait != 1 {
		t.Fatalf("wsrep_sync_wait = %d (%v), want 1 on Galera", wait, err)
	}

	// Node 2 is desynchronised, as Donor/Desynced, and skipped for the next one in order.
	rootSQL(t, 2, "SET GLOBAL wsrep_desync = ON")
	t.Cleanup(func() { rootSQL(t, 2, "SET GLOBAL wsrep_desync = OFF") })
	if got := freshConn(t, db); got != "4306" {
		t.Fatalf("with node 2 desynchronised a new connection is on port %s, want 4306", got)
	}
	rootSQL(t, 2, "SET GLOBAL wsrep_desync = OFF")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var st string
		if err := db.QueryRow("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'WSREP_LOCAL_STATE'").Scan(&st); err == nil && st == "4" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node 1 not Synced again")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Connections are sticky. Node 2 is Synced again, and connections stay on node 1.
	for range 3 {
		if got := freshConn(t, db); got != "4306" {
			t.Fatalf("after node 2 came back a new connection is on port %s, want 4306 (sticky)", got)
		}
	}

	// One node of the cluster alone, in a DSN of one server, reads causally too.
	single, err := dbx.Open(ctx, dbx.Config{DSN: "onceflow_admin:onceflow_admin@tcp(127.0.0.1:4306)/onceflow_test", MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	if err := single.QueryRow("SELECT @@wsrep_sync_wait").Scan(&wait); err != nil || wait != 1 {
		t.Fatalf("one Galera node: wsrep_sync_wait = %d (%v), want 1", wait, err)
	}
}

// Two nodes update one row at once. The write set certified second fails at COMMIT with
// 1213, which IsLockConflict reports, and the inbox runs the transaction again. The
// commit's outcome is known, because it rolled back.
func TestGaleraCertificationConflict(t *testing.T) {
	galera(t)
	ctx := context.Background()
	a, err := dbx.Open(ctx, dbx.Config{DSN: galeraDSN("onceflow_admin", "4306"), MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dbx.Open(ctx, dbx.Config{DSN: galeraDSN("onceflow_admin", "4307"), MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	table := fmt.Sprintf("galera_cert_%d", time.Now().UnixNano())
	if _, err := a.Exec("CREATE TABLE " + table + " (id INT PRIMARY KEY, n INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	defer a.Exec("DROP TABLE " + table)
	if _, err := a.Exec("INSERT INTO " + table + " VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	txA, err := a.BeginTx(ctx, dbx.TxOptions)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txA.Exec("UPDATE " + table + " SET n = n + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	err = dbx.InTx(ctx, b, func(tx *sql.Tx) error {
		_, err := tx.Exec("UPDATE " + table + " SET n = n + 10 WHERE id = 1")
		return err
	})
	if err != nil {
		t.Fatalf("node 2's transaction: %v", err)
	}
	err = txA.Commit()
	if err == nil {
		t.Fatal("node 1's transaction committed over node 2's")
	}
	if !dbx.IsLockConflict(err) || dbx.IsConnError(err) {
		t.Fatalf("certification failure %v: IsLockConflict %v, IsConnError %v; want a lock conflict", err, dbx.IsLockConflict(err), dbx.IsConnError(err))
	}
}

// The node that every connection writes through gets SIGKILL while workers commit messages
// the inbox's way. The dedup row and the effect go in one transaction. A message whose
// commit failed for any reason runs again, an unknown outcome included. A duplicate dedup
// row then says it is done. Afterwards every message has exactly one effect, though some
// commits that got no answer had committed on the cluster. Run again without the dedup
// row's check, they would have been duplicates.
func TestGaleraNodeKillNoDuplicates(t *testing.T) {
	galera(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db, err := dbx.Open(ctx, dbx.Config{DSN: galeraDSN("onceflow_admin", galeraPorts...), MaxOpenConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	victim := nodePort(t, db)
	var vn int
	fmt.Sscan(victim, &vn)
	vn -= 4305 // port 4306 is node 1
	suffix := time.Now().UnixNano()
	dedup, effect := fmt.Sprintf("galera_dedup_%d", suffix), fmt.Sprintf("galera_effect_%d", suffix)
	for _, q := range []string{
		"CREATE TABLE " + dedup + " (msg INT PRIMARY KEY)",
		"CREATE TABLE " + effect + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, msg INT NOT NULL)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	defer db.Exec("DROP TABLE " + dedup)
	defer db.Exec("DROP TABLE " + effect)

	const msgs, workers = 600, 6
	var next, unknown, unknownCommitted, done atomic.Int64
	var wg sync.WaitGroup
	var failMu sync.Mutex
	var fails []error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m := next.Add(1)
				if m > msgs {
					return
				}
				wasUnknown := false
				for try := 0; ; try++ {
					err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
						if _, err := tx.Exec("INSERT INTO "+dedup+" (msg) VALUES (?)", m); err != nil {
							return err
						}
						_, err := tx.Exec("INSERT INTO "+effect+" (msg) VALUES (?)", m)
						return err
					})
					if err == nil || dbx.IsDuplicate(err) {
						if wasUnknown && dbx.IsDuplicate(err) {
							// The commit that got no answer had committed. Run again
							// without the dedup row, it would have been a second effect.
							unknownCommitted.Add(1)
						}
						done.Add(1)
						break
					}
					if errors.Is(err, dbx.ErrCommitUnknown) {
						unknown.Add(1)
						wasUnknown = true
					}
					if ctx.Err() != nil || !(dbx.IsConnError(err) || dbx.IsLockConflict(err) || errors.Is(err, dbx.ErrCommitUnknown)) {
						failMu.Lock()
						fails = append(fails, fmt.Errorf("message %d: %w", m, err))
						failMu.Unlock()
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	for done.Load() < msgs/4 {
		time.Sleep(10 * time.Millisecond)
	}
	infra(t, "galera-kill", fmt.Sprint(vn))
	t.Cleanup(func() { infra(t, "galera-start", fmt.Sprint(vn)) })
	wg.Wait()
	if len(fails) > 0 {
		t.Fatalf("%d messages failed: %v", len(fails), fails[0])
	}
	if got := freshConn(t, db); got == victim {
		t.Fatalf("connections still on the killed node's port %s", victim)
	}
	var rows, distinct, dups int
	if err := db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT msg) FROM "+effect).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT COUNT(*) FROM " + dedup).Scan(&dups); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d (port %s) killed; %d commits got no answer, %d of them had committed (a naive retry would have duplicated those); effects %d, distinct %d, dedup rows %d",
		vn, victim, unknown.Load(), unknownCommitted.Load(), rows, distinct, dups)
	if rows != msgs || distinct != msgs || dups != msgs {
		t.Fatalf("effects %d (distinct messages %d), dedup rows %d: want %d each", rows, distinct, dups, msgs)
	}
}

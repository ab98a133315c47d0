package dbx_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// idleChildEnv set to the DSN makes the test binary the frozen process of
// TestIdleTxTimeoutFrozenProcess. See TestMain.
const idleChildEnv = "DBX_TEST_IDLE_CHILD_DSN"

// idleChildTimeoutEnv is the child's db.idle_tx_timeout, as time.ParseDuration reads it.
const idleChildTimeoutEnv = "DBX_TEST_IDLE_CHILD_TIMEOUT"

func TestMain(m *testing.M) {
	if dsn := os.Getenv(idleChildEnv); dsn != "" {
		os.Exit(idleChild(dsn, os.Getenv(idleChildTimeoutEnv)))
	}
	os.Exit(m.Run())
}

// idleChild opens a pool of one connection with dbx.Open, locks row 1 of idle_lock in a
// transaction and says "locked". It then waits for a line on stdin, while the test stops
// it. Once resumed it goes on with the transaction and reports how it failed, then runs the
// transaction again on the same pool and reports that.
func idleChild(dsn, timeout string) int {
	ctx := context.Background()
	d, err := time.ParseDuration(timeout)
	if err != nil {
		fmt.Printf("error: timeout %q: %v\n", timeout, err)
		return 2
	}
	cfg := testenv.Config(dsn, 1)
	cfg.IdleTxTimeout = d
	db, err := dbx.Open(ctx, cfg)
	if err != nil {
		fmt.Printf("error: open: %v\n", err)
		return 2
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, dbx.TxOptions)
	if err != nil {
		fmt.Printf("error: begin: %v\n", err)
		return 2
	}
	bump := testenv.Rebind("UPDATE idle_lock SET v = v + ? WHERE id = 1")
	if _, err := tx.ExecContext(ctx, bump, 100); err != nil {
		fmt.Printf("error: lock: %v\n", err)
		return 2
	}
	fmt.Println("locked")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Printf("error: stdin: %v\n", err)
		return 2
	}
	_, err = tx.ExecContext(ctx, bump, 100)
	if err == nil {
		err = tx.Commit()
	} else {
		_ = tx.Rollback()
	}
	fmt.Printf("resumed: conn_error=%t err=%v\n", dbx.IsConnError(err), err)
	err = dbx.InTx(ctx, db, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, bump, 1)
		return err
	})
	fmt.Printf("retried: err=%v\n", err)
	return 0
}

// A process frozen inside a transaction (SIGSTOP) holds that transaction's row locks only
// until db.idle_tx_timeout. The server then ends its session, and another session's update
// of the locked row goes through instead of waiting out its lock wait timeout. Once
// resumed, the frozen process finds its transaction gone with an error IsConnError
// reports, nothing of it committed, and the pool runs the retry on a new connection.
func TestIdleTxTimeoutFrozenProcess(t *testing.T) {
	d := testenv.DB(t, 2)
	if testenv.Dialect() == dbx.MySQL8 {
		t.Skip("MySQL 8 has no idle transaction timeout, so db.dialect=mysql8 sets none")
	}
	d.AdminExec(t, "CREATE TABLE idle_lock (id INT PRIMARY KEY, v INT NOT NULL)")
	d.AdminExec(t, "INSERT INTO idle_lock (id, v) VALUES (1, 0)")
	const idle = 2 * time.Second
	// The other session waits up to 20 s for a lock. Without the idle timeout it would
	// give up with a lock wait timeout while the child is still frozen.
	const lockWait = 20

	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run", "^$")
	cmd.Env = append(os.Environ(), idleChildEnv+"="+d.DSN, idleChildTimeoutEnv+"="+idle.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("child exited before %s", what)
			}
			if strings.HasPrefix(l, "error:") {
				t.Fatalf("child: %s", l)
			}
			return l
		case <-time.After(60 * time.Second):
			t.Fatalf("no %s from the child within 60 s", what)
		}
		return ""
	}
	if l := next("lock"); l != "locked" {
		t.Fatalf("child said %q, want locked", l)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	conn, err := d.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	setWait := fmt.Sprintf("SET SESSION innodb_lock_wait_timeout = %d", lockWait)
	if testenv.Dialect().IsPostgres() {
		setWait = fmt.Sprintf("SET lock_timeout = '%ds'", lockWait)
	}
	if _, err := conn.ExecContext(ctx, setWait); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = conn.ExecContext(ctx, testenv.Rebind("UPDATE idle_lock SET v = v + ? WHERE id = 1"), 10)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("update of the row the frozen process locked: %v after %s (lock conflict: %t), want it to go through once the server ended the frozen session",
			err, took.Round(time.Millisecond), dbx.IsLockConflict(err))
	}
	t.Logf("the update of the locked row waited %s (db.idle_tx_timeout %s, lock wait timeout %d s)", took.Round(time.Millisecond), idle, lockWait)

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	resumed := next("the resumed transaction's outcome")
	t.Logf("child: %s", resumed)
	if !strings.HasPrefix(resumed, "resumed: conn_error=true ") {
		t.Errorf("the resumed transaction: %q, want an error that IsConnError reports", resumed)
	}
	retried := next("the retry's outcome")
	if retried != "retried: err=<nil>" {
		t.Errorf("the retry on the same pool: %q, want it to succeed", retried)
	}
	var v int
	if err := d.DB.QueryRow("SELECT v FROM idle_lock WHERE id = 1").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != 11 {
		t.Errorf("v = %d, want 11: the other session's 10 and the retry's 1, nothing of the frozen transaction", v)
	}
}

// db.idle_tx_timeout is on by default, and a configured 0, stored as NoIdleTxTimeout, turns
// it off.
func TestIdleTxTimeoutSetting(t *testing.T) {
	if got := (dbx.Config{}).WithDefaults().IdleTxTimeout; got != 30*time.Second {
		t.Errorf("default IdleTxTimeout %s, want 30s", got)
	}
	if got := (dbx.Config{IdleTxTimeout: dbx.NoIdleTxTimeout}).WithDefaults().IdleTxTimeout; got >= 0 {
		t.Errorf("NoIdleTxTimeout became %s, want it to stay off", got)
	}
}

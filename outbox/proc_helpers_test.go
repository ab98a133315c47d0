package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// ---------------------------------------------------------------------------------------
// Relay processes are this test binary itself, run with relayChildEnv set. TestMain then
// runs `router relay` by routercmd.Run instead of the tests. So the tests kill relays as
// real processes without building the router.

// relayChildEnv set to 1 makes the test binary a `router relay` process. See main_test.go.
const relayChildEnv = "OUTBOX_TEST_RELAY_CHILD"

// relayBinary is the executable the relay processes run: this test binary.
func relayBinary(t testing.TB) string {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatalf("test binary path: %v", err)
	}
	return bin
}

// relayProc is one `router relay` child process.
type relayProc struct {
	name string
	cmd  *exec.Cmd
	log  string // stderr file
	done chan struct{}
	err  error // from Wait, valid after done
}

// startRelayProc starts `router relay` with the ONCEFLOW_* settings of env on top of a clean
// environment. The parent's ONCEFLOW_* variables are not inherited.
func startRelayProc(t testing.TB, name string, env map[string]string) *relayProc {
	t.Helper()
	bin := relayBinary(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir // no configs/router.yaml here: defaults + env only
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCEFLOW_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, relayChildEnv+"=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &relayProc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		<-p.done
	})
	return p
}

func (p *relayProc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
}

// wait waits up to d for the process to exit. It returns false if the process still runs.
func (p *relayProc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// exitCode is the exit status, -1 when killed by a signal.
func (p *relayProc) exitCode() int {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		return -2
	}
	return 0
}

func (p *relayProc) logText(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatalf("read %s log: %v", p.name, err)
	}
	return string(b)
}

// tail returns the last n lines of the process log.
func (p *relayProc) tail(t testing.TB, n int) string {
	lines := strings.Split(strings.TrimSpace(p.logText(t)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------------------------------
// Paced writers keep committing events until stopped, out of id order and in per-key
// sequences.

type pacedWriters struct {
	mu      sync.Mutex
	ids     []string
	maxTx   time.Duration // slowest business transaction
	errs    []error
	stop    chan struct{}
	wg      sync.WaitGroup
	stopped bool
}

// startPacedWriters starts n writers. Each commits a transaction of 1..3 events every pace,
// give or take 50%, until stop is called. Writer w owns keys p<w>-k0..k2 and numbers their
// events.
func startPacedWriters(t testing.TB, db *sql.DB, topic string, n int, pace time.Duration) *pacedWriters {
	t.Helper()
	w := newWriter(t)
	pw := &pacedWriters{stop: make(chan struct{})}
	for wr := range n {
		pw.wg.Go(func() {
			seq := map[string]int{}
			for i := 0; ; {
				select {
				case <-pw.stop:
					return
				case <-time.After(pace/2 + rand.N(pace)):
				}
				cnt := 1 + rand.IntN(3)
				var evs []outbox.Event
				next := map[string]int{}
				for j := range cnt {
					key := fmt.Sprintf("p%02d-k%d", wr, rand.IntN(3))
					next[key]++
					p, _ := json.Marshal(seqPayload{Writer: wr, Key: key, Seq: seq[key] + next[key]})
					evs = append(evs, outbox.Event{ID: fmt.Sprintf("p%02d-e%06d", wr, i+j), Type: "Paced", Topic: topic, Key: key, Payload: p})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				start := time.Now()
				err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
					for _, e := range evs {
						if err := w.Add(ctx, tx, e); err != nil {
							return err
						}
					}
					time.Sleep(time.Duration(rand.IntN(3001)) * time.Microsecond)
					return nil
				})
				took := time.Since(start)
				cancel()
				pw.mu.Lock()
				if err != nil {
					if dbx.IsLockConflict(err) {
						pw.mu.Unlock()
						continue // retry the same events
					}
					pw.errs = append(pw.errs, fmt.Errorf("writer %d: %w", wr, err))
					pw.mu.Unlock()
					return
				}
				pw.maxTx = max(pw.maxTx, took)
				for _, e := range evs {
					pw.ids = append(pw.ids, e.ID)
				}
				pw.mu.Unlock()
				for k, c := range next {
					seq[k] += c
				}
				i += cnt
			}
		})
	}
	t.Cleanup(func() { pw.finish(t) })
	return pw
}

// finish stops the writers and returns the committed event ids.
func (pw *pacedWriters) finish(t testing.TB) []string {
	t.Helper()
	pw.mu.Lock()
	if !pw.stopped {
		pw.stopped = true
		close(pw.stop)
	}
	pw.mu.Unlock()
	pw.wg.Wait()
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.errs) > 0 {
		t.Errorf("business transactions failed: %v", pw.errs)
	}
	return append([]string(nil), pw.ids...)
}

func (pw *pacedWriters) count() int {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return len(pw.ids)
}

// committed returns the ids committed so far, in commit order per writer.
func (pw *pacedWriters) committed() []string {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return append([]string(nil), pw.ids...)
}

// failed returns the errors of business transactions that failed so far.
func (pw *pacedWriters) failed() []error {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return append([]error(nil), pw.errs...)
}

func (pw *pacedWriters) slowest() time.Duration {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return pw.maxTx
}

func countLines(s, substr string) int { return strings.Count(s, substr) }

var (
	plainTestOnce sync.Once
	plainTestDir  string
	plainTestBin  string
	plainTestErr  error
)

// runWithoutRace reruns the calling test in a copy of this test binary built without the
// race detector, when this one has it. It reports whether it did, and the caller then
// returns. It serves the tests that drive Sarama's transactional producer into its error
// paths, such as fencing or a lost broker. Sarama itself has a known data race there,
// IBM/sarama#2913. transactionManager.lastError is written under statusLock and read under
// another lock. The race detector would report that against the test. The child's output
// is logged.
func runWithoutRace(t *testing.T) bool {
	t.Helper()
	if !raceEnabled {
		return false
	}
	plainTestOnce.Do(func() {
		if plainTestDir, plainTestErr = os.MkdirTemp("", "onceflow-outbox-test-*"); plainTestErr != nil {
			return
		}
		plainTestBin = filepath.Join(plainTestDir, "outbox.test")
		out, err := exec.Command("go", "test", "-c", "-o", plainTestBin, "github.com/onceflow/onceflow/outbox").CombinedOutput()
		if err != nil {
			plainTestErr = fmt.Errorf("go test -c: %v\n%s", err, out)
		}
	})
	if plainTestErr != nil {
		t.Fatal(plainTestErr)
	}
	cmd := exec.Command(plainTestBin, "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s, run without -race (IBM/sarama#2913):\n%s", t.Name(), bytes.TrimSpace(out))
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatalf("%s without -race: %v", t.Name(), err)
	}
	return true
}

// removePlainTestBinary removes what runWithoutRace built.
func removePlainTestBinary() {
	if plainTestDir != "" {
		_ = os.RemoveAll(plainTestDir)
	}
}

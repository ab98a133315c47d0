package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

var reconciledRe = regexp.MustCompile(`outbox relay reconciled[^\n]* rows=(\d+)`)

// relayEnv is the environment of a `router relay` child on the test database and broker.
func relayEnv(d testenv.Database, k kafkax.Config, txnID, positions, owner string, extra map[string]string) map[string]string {
	env := map[string]string{
		"ONCEFLOW_DB_DSN":                  d.DSN,
		"ONCEFLOW_KAFKA_BROKERS":           strings.Join(k.Brokers, ","),
		"ONCEFLOW_ADMIN_LISTEN":            "127.0.0.1:0",
		"ONCEFLOW_RELAY_TRANSACTIONAL_ID":  txnID,
		"ONCEFLOW_RELAY_POSITIONS_TOPIC":   positions,
		"ONCEFLOW_RELAY_OWNER":             owner,
		"ONCEFLOW_RELAY_LEASE_TTL":         "2s",
		"ONCEFLOW_RELAY_BATCH_SIZE":        "40",
		"ONCEFLOW_RELAY_POLL_INTERVAL":     "5ms",
		"ONCEFLOW_RELAY_RETRY_BACKOFF":     "100ms",
		"ONCEFLOW_RELAY_MAX_RETRY_BACKOFF": "1s",
	}
	if c := testenv.Config(d.DSN, 0); c.Dialect != "" {
		env["ONCEFLOW_DB_DIALECT"] = c.Dialect // mysql8 on the MariaDB server
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// kills is the number of relay processes that TestEOSRelayProcessKill9 kills. It is 15
// unless OFTEST_RELAY_KILLS says otherwise.
func kills(t *testing.T) int {
	if v := os.Getenv("OFTEST_RELAY_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("OFTEST_RELAY_KILLS=%q: want a positive integer", v)
		}
		return n
	}
	return 15
}

// TestEOSRelayProcessKill9 kills `router relay` child processes again and again while
// business transactions keep committing. Some die at a crash point, between the Kafka
// commit and the database mark or just before the Kafka commit. The process exits with 137
// right there. Others get SIGKILL at random moments, during start-up and reconciliation
// too. Afterwards a clean relay drains the table. A read_committed reader must see every
// event exactly once, in per-key order, and no row may be left unpublished.
func TestEOSRelayProcessKill9(t *testing.T) {
	t.Parallel()
	d := testenv.DB(t, 16)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-kill9", 4)
	positions := testenv.Topic(t, k, "relay-positions-kill9", 1)
	txnID := "test-kill9-" + topic

	writers := startPacedWriters(t, d.DB, topic, 6, 4*time.Millisecond)
	n := kills(t)
	var (
		atCommit, beforeCommit, sigkills int
		procs                            []*relayProc
	)
	for i := range n {
		extra := map[string]string{}
		mode := i % 3
		switch mode {
		case 0:
			extra["CHAOS_RELAY_CRASH_POINT"] = fmt.Sprintf("after-kafka-commit:%d", 1+rand.IntN(4))
		case 1:
			extra["CHAOS_RELAY_CRASH_POINT"] = fmt.Sprintf("before-kafka-commit:%d", 1+rand.IntN(4))
		}
		p := startRelayProc(t, fmt.Sprintf("relay-%02d", i), relayEnv(d, k, txnID, positions, "kill9-owner", extra))
		procs = append(procs, p)
		if mode == 2 {
			time.Sleep(time.Duration(50+rand.IntN(900)) * time.Millisecond)
			p.kill()
		} else if !p.wait(20 * time.Second) {
			t.Fatalf("%s did not reach its crash point %s within 20s:\n%s", p.name, extra["CHAOS_RELAY_CRASH_POINT"], p.tail(t, 20))
		}
		<-p.done
		switch code := p.exitCode(); {
		case mode != 2 && code == 137:
			if mode == 0 {
				atCommit++
			} else {
				beforeCommit++
			}
		case mode == 2 && code == -1:
			sigkills++
		case mode == 2 && code == 137:
			t.Fatalf("%s exited 137 without a crash point", p.name)
		default:
			t.Fatalf("%s (mode %d) exited with %d (%v):\n%s", p.name, mode, code, p.err, p.tail(t, 20))
		}
	}
	ids := writers.finish(t)
	t.Logf("%d kills: %d after the Kafka commit, %d before it, %d random SIGKILLs; %d events committed meanwhile",
		n, atCommit, beforeCommit, sigkills, len(ids))

	final := startRelayProc(t, "relay-final", relayEnv(d, k, txnID, positions, "kill9-owner", nil))
	waitAllPublished(t, d.DB, len(ids), 60*time.Second)
	_ = final.cmd.Process.Signal(os.Interrupt)
	if !final.wait(20*time.Second) || final.exitCode() != 0 {
		t.Fatalf("final relay did not stop cleanly (exit %d):\n%s", final.exitCode(), final.tail(t, 20))
	}
	if !strings.Contains(final.logText(t), "outbox relay session started") {
		t.Fatalf("final relay never started a session:\n%s", final.tail(t, 20))
	}
	// Every crash after a Kafka commit left a committed, unmarked batch. A later session
	// must have found it in the positions topic and marked it without republishing.
	reconciledSessions, reconciledRows := 0, 0
	for _, p := range append(procs, final) {
		for _, m := range reconciledRe.FindAllStringSubmatch(p.logText(t), -1) {
			reconciledSessions++
			n, _ := strconv.Atoi(m[1])
			reconciledRows += n
		}
	}
	t.Logf("%d sessions reconciled %d rows that were in Kafka but not marked", reconciledSessions, reconciledRows)
	if atCommit > 0 && reconciledSessions == 0 {
		t.Fatalf("%d crashes between the Kafka commit and the mark, but no session reconciled anything", atCommit)
	}

	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	assertPerKeyOrder(t, d.DB, recs)
	if n := pendingRows(t, d.DB); n != 0 {
		t.Fatalf("%d rows unpublished after the drain", n)
	}
	t.Logf("read_committed reader: %d records, every event exactly once", len(recs))
}

// TestAtLeastOnceRelayProcessDuplicatesAtSameCrash runs the same crash point with
// relay.exactly_once=false. The idempotent producer's batch is acked, the process dies
// before the mark, and the next relay publishes the batch again. It shows that the
// exactly-once check above can fail. Here it must find duplicates and nothing missing.
func TestAtLeastOnceRelayProcessDuplicatesAtSameCrash(t *testing.T) {
	t.Parallel()
	d := testenv.DB(t, 8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-alo-crash", 4)
	ctx := context.Background()
	w := newWriter(t)
	var ids []string
	for i := range 400 {
		id := fmt.Sprintf("alo-%04d", i)
		addCommitted(t, ctx, d.DB, w, outbox.Event{ID: id, Type: "T", Topic: topic, Key: fmt.Sprintf("k%d", i%7), Payload: []byte(id)})
		ids = append(ids, id)
	}
	const crashes = 3
	for i := range crashes {
		env := relayEnv(d, k, "", "", "", map[string]string{"ONCEFLOW_RELAY_EXACTLY_ONCE": "false",
			"CHAOS_RELAY_CRASH_POINT": "after-kafka-commit:2"})
		p := startRelayProc(t, fmt.Sprintf("alo-%d", i), env)
		if !p.wait(20*time.Second) || p.exitCode() != 137 {
			t.Fatalf("%s did not crash at after-kafka-commit (exit %d):\n%s", p.name, p.exitCode(), p.tail(t, 20))
		}
	}
	final := startRelayProc(t, "alo-final", relayEnv(d, k, "", "", "", map[string]string{"ONCEFLOW_RELAY_EXACTLY_ONCE": "false"}))
	waitAllPublished(t, d.DB, len(ids), 60*time.Second)
	_ = final.cmd.Process.Signal(os.Interrupt)
	final.wait(20 * time.Second)

	problems := exactlyOnceProblems(readAll(t, k, topic), ids)
	var dups, other int
	for _, p := range problems {
		if strings.HasPrefix(p, "duplicate ") {
			dups++
		} else {
			other++
		}
	}
	t.Logf("at-least-once relay, %d crashes after Kafka's ack: %d events duplicated on Kafka, %d other problems", crashes, dups, other)
	if other > 0 {
		t.Fatalf("at-least-once relay lost or invented events: %v", problems)
	}
	// Each crash leaves one acked but unmarked batch of 40, the second batch of each run.
	if dups != crashes*40 {
		t.Fatalf("%d duplicated events, want %d (one batch of 40 per crash): the crash point did not duplicate as expected", dups, crashes*40)
	}
}

// leaseOwner returns the owner of the shard's lease and whether it is live.
func leaseOwner(t *testing.T, d testenv.Database) (string, bool) {
	t.Helper()
	var owner string
	var live bool
	err := d.DB.QueryRow("SELECT owner, expires_at > CURRENT_TIMESTAMP(6) FROM relay_lease WHERE shard = 'default'").Scan(&owner, &live)
	if err == sql.ErrNoRows {
		return "", false
	}
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	return owner, live
}

// TestEOSRelayTwoProcessesFailover starts two relay processes on one shard together. Only
// the lease owner publishes. Killing it with SIGKILL hands the shard to the other within
// the lease TTL of 2s plus its polling and session start. No event reaches Kafka twice.
func TestEOSRelayTwoProcessesFailover(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	d := testenv.DB(t, 12)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-failover", 4)
	positions := testenv.Topic(t, k, "relay-positions-failover", 1)
	txnID := "test-failover-" + topic

	writers := startPacedWriters(t, d.DB, topic, 4, 5*time.Millisecond)
	procs := map[string]*relayProc{}
	for _, name := range []string{"relay-a", "relay-b"} {
		procs[name] = startRelayProc(t, name, relayEnv(d, k, txnID, positions, name, nil))
	}
	// Wait until one of them owns the shard and has published for a while.
	deadline := time.Now().Add(20 * time.Second)
	var active string
	for {
		if o, live := leaseOwner(t, d); live && countRows(t, d.DB, "published_at IS NOT NULL") > 200 {
			active = o
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no relay took the lease and published within 20s:\n%s\n%s", procs["relay-a"].tail(t, 10), procs["relay-b"].tail(t, 10))
		}
		time.Sleep(50 * time.Millisecond)
	}
	standby := map[string]string{"relay-a": "relay-b", "relay-b": "relay-a"}[active]
	if strings.Contains(procs[standby].logText(t), "outbox relay session started") {
		t.Fatalf("%s started a session while %s held the lease:\n%s", standby, active, procs[standby].tail(t, 10))
	}
	t.Logf("%s owns the shard, %s is standing by; killing %s with SIGKILL", active, standby, active)
	procs[active].kill()
	<-procs[active].done
	killed := time.Now()
	published := countRows(t, d.DB, "published_at IS NOT NULL")
	var takeover time.Duration
	for {
		if o, live := leaseOwner(t, d); o == standby && live && countRows(t, d.DB, "published_at IS NOT NULL") > published {
			takeover = time.Since(killed)
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("%s did not take over within 30s:\n%s", standby, procs[standby].tail(t, 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The design bound is the lease TTL plus the standby poll of ttl/4 plus the session
	// start. It is logged and not asserted, because a loaded CI machine stretches it. The
	// test asserts three things. The standby did not publish while the lease was live, as
	// checked above. It did take over within a liveness limit of 30 s. No event reached
	// Kafka twice, as checked below.
	bound := ttl + 3*time.Second
	t.Logf("%s took over and published %s after the kill (design bound %s)", standby, takeover.Round(time.Millisecond), bound)
	time.Sleep(500 * time.Millisecond)
	ids := writers.finish(t)
	waitAllPublished(t, d.DB, len(ids), 60*time.Second)
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	assertPerKeyOrder(t, d.DB, recs)
}

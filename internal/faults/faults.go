// Package faults breaks the inbox and the outbox relay on purpose, in a build whose checker
// must show that it catches the violation (the chaos harness's broken routers:
// tools/chaosrouter, scripts/chaos.sh CHAOS_BROKEN=inbox|reconcile, make chaos-broken), and
// crashes a chaos build's relay at a chosen point (SetRelayCrash). No hooks are installed
// unless such a build sets them, before any delivery is processed or any relay runs.
package faults

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

// Inbox breaks the inbox.
type Inbox interface {
	// ClaimSQL returns the statement that claims a delivery's inbox row in Process, given
	// the correct one.
	ClaimSQL(q string) string
}

// Outbox breaks the relay.
type Outbox interface {
	// SkipReconcile reports whether an exactly-once session skips its reconciliation at
	// start, so that a batch committed to Kafka but not marked is published again.
	SkipReconcile() bool
}

var (
	inboxHooks  Inbox
	outboxHooks Outbox
)

// SetInbox installs h for every inbox of the process (nil removes them).
func SetInbox(h Inbox) { inboxHooks = h }

// SetOutbox installs h for every relay of the process (nil removes them).
func SetOutbox(h Outbox) { outboxHooks = h }

// ClaimStatement is the claim statement q as the installed hooks have it (q itself without
// hooks).
func ClaimStatement(q string) string {
	if inboxHooks == nil {
		return q
	}
	return inboxHooks.ClaimSQL(q)
}

// SkipReconcile reports whether the installed hooks skip the relay's reconciliation.
func SkipReconcile() bool { return outboxHooks != nil && outboxHooks.SkipReconcile() }

// RelayCrashEnv names the crash hook of a chaos build's relay: "<point>[:n]" makes the
// process exit with status 137 (as if killed) the n-th time (default the 1st) a batch
// reaches point: before-kafka-commit, after-kafka-commit (Kafka committed or acked, rows not
// yet marked) or after-mark.
const RelayCrashEnv = "CHAOS_RELAY_CRASH_POINT"

var relayPoint func(point string)

// RelayPoint is the hook the runtime's relays call at each batch point (nil: none).
func RelayPoint() func(point string) { return relayPoint }

// SetRelayCrash installs the crash hook spec describes (RelayCrashEnv's form); empty
// removes it.
func SetRelayCrash(spec string) error {
	if spec == "" {
		relayPoint = nil
		return nil
	}
	point, nth, _ := strings.Cut(spec, ":")
	switch point {
	case "before-kafka-commit", "after-kafka-commit", "after-mark":
	default:
		return fmt.Errorf("%s=%q: unknown point (before-kafka-commit, after-kafka-commit, after-mark)", RelayCrashEnv, spec)
	}
	n := int64(1)
	if nth != "" {
		v, err := strconv.ParseInt(nth, 10, 64)
		if err != nil || v < 1 {
			return errors.New(RelayCrashEnv + ": the count after ':' must be a positive integer")
		}
		n = v
	}
	var seen atomic.Int64
	relayPoint = func(p string) {
		if p == point && seen.Add(1) == n {
			fmt.Fprintf(os.Stderr, "router: %s: crashing at %s (#%d)\n", RelayCrashEnv, p, n)
			os.Exit(137)
		}
	}
	return nil
}

// Package faults breaks the inbox and the outbox relay on purpose, in a build whose checker
// must show that it catches the violation. Such builds are the chaos harness's broken
// routers of tools/chaosrouter, run by scripts/chaos.sh with CHAOS_BROKEN=inbox|reconcile or
// by make chaos-broken. The package also crashes a chaos build's relay at a chosen point,
// as SetRelayCrash sets. No hooks are installed unless such a build sets them, before any
// delivery is processed or any relay runs.
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

// SetInbox installs h for every inbox of the process. A nil h removes the hooks.
func SetInbox(h Inbox) { inboxHooks = h }

// SetOutbox installs h for every relay of the process. A nil h removes the hooks.
func SetOutbox(h Outbox) { outboxHooks = h }

// ClaimStatement is the claim statement q as the installed hooks have it. Without hooks it
// is q itself.
func ClaimStatement(q string) string {
	if inboxHooks == nil {
		return q
	}
	return inboxHooks.ClaimSQL(q)
}

// SkipReconcile reports whether the installed hooks skip the relay's reconciliation.
func SkipReconcile() bool { return outboxHooks != nil && outboxHooks.SkipReconcile() }

// RelayCrashEnv names the crash hook of a chaos build's relay. Its value "<point>[:n]"
// makes the process exit with status 137, as if killed, the n-th time a batch reaches
// point. n is 1 by default. The points are before-kafka-commit, after-kafka-commit and
// after-mark. At after-kafka-commit Kafka has committed or acked, and the rows are not yet
// marked.
const RelayCrashEnv = "CHAOS_RELAY_CRASH_POINT"

var relayPoint func(point string)

// RelayPoint is the hook the runtime's relays call at each batch point, or nil for none.
func RelayPoint() func(point string) { return relayPoint }

// SetRelayCrash installs the crash hook that spec describes, in RelayCrashEnv's form. An
// empty spec removes it.
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

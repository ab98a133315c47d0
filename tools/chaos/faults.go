package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/internal/faults"
)

// relayCrashEnv is the variable that arms a chaos router's relay crash point.
const relayCrashEnv = faults.RelayCrashEnv

// injectFaults plays the run's fault schedule while the producer sends the orders, and
// returns once both are done (an error only when the harness was interrupted).
func (h *harness) injectFaults(ctx context.Context) error {
	rng := rand.New(rand.NewPCG(h.o.seed, 0xc4a05))
	events := schedule(h.p, rng)
	writeSchedule(filepath.Join(h.o.runDir, "schedule.txt"), events)
	h.logf("schedule: %d fault events over %s (schedule.txt)", len(events), h.p.window)

	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	var fwg sync.WaitGroup
	start := time.Now()
	if h.p.rssEvery > 0 {
		h.rssStop, h.rssDone = make(chan struct{}), make(chan struct{})
		go func() { defer close(h.rssDone); h.sampleRSS(h.p.rssEvery, h.rssStop) }()
	}
	churnStop := make(chan struct{})
	var churnDone sync.WaitGroup
	if h.p.churn > 0 {
		churnDone.Add(1)
		go func() { defer churnDone.Done(); h.churn(h.p.churn, churnStop) }()
		h.logf("router %s joins and leaves every %s while the producer sends", h.slots[len(h.slots)-1].name, h.p.churn)
	}
	fwg.Add(1)
	go func() {
		defer fwg.Done()
		for _, e := range events {
			select {
			case <-fctx.Done():
				return
			case <-time.After(time.Until(start.Add(e.at))):
			}
			fwg.Add(1)
			go func() {
				defer fwg.Done()
				h.fault(e)
			}()
		}
	}()

	produced, err := h.produce(ctx)
	if err != nil {
		h.harnessErr("producer: %v", err)
	}
	h.logf("producer done: %d orders in %d segments", produced, len(h.info.Ledgers))
	close(churnStop)
	churnDone.Wait()
	fwg.Wait()
	fcancel()
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	return nil
}

// produce sends the run's orders: segments of orders, each a `router produce` run with its
// own ledger (added to the run's ledgers once sent); a segment that fails (broker
// restarting) is sent again in full with the same seed: the same orders and payloads, i.e.
// more duplicate deliveries, which is what a producer retry is. It returns the orders of the
// segments sent.
func (h *harness) produce(ctx context.Context) (int, error) {
	perSeg := h.p.orders / h.p.segments
	dupRate := h.p.dupRate
	if dupRate == 0 {
		dupRate = 0.3
	}
	produced := 0
	for seg := 0; seg < h.p.segments; seg++ {
		prefix := fmt.Sprintf("%s-s%02d", h.info.Prefix, seg)
		ledger := filepath.Join(h.o.runDir, fmt.Sprintf("ledger-s%02d.txt", seg))
		deadline := time.Now().Add(3*time.Minute + time.Duration(float64(perSeg)*1.3/h.p.rate*float64(time.Second)))
		for attempt := 1; ; attempt++ {
			cmd := exec.CommandContext(ctx, h.bin, "produce", "--orders", fmt.Sprint(perSeg), "--dup-rate", fmt.Sprint(dupRate),
				"--poison", fmt.Sprint(max(perSeg/100, 2*len(poisonKinds))), "--rate", fmt.Sprint(h.p.rate), "--prefix", prefix,
				"--seed", fmt.Sprint(h.o.seed*1000+uint64(seg)), "--ledger", ledger)
			cmd.Env = append(h.baseEnv, "ONCEFLOW_DB_DSN="+h.appDSN)
			out, err := cmd.CombinedOutput()
			if err == nil {
				produced += perSeg
				h.logf("segment %d/%d: %s", seg+1, h.p.segments, strings.TrimSpace(lastLine(string(out))))
				break
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return produced, fmt.Errorf("segment %s: %v: %s", prefix, err, lastLine(string(out)))
			}
			h.logf("segment %d attempt %d failed (%s): sending it again in 2s", seg+1, attempt, strings.TrimSpace(lastLine(string(out))))
			time.Sleep(2 * time.Second)
		}
		h.info.Ledgers = append(h.info.Ledgers, ledger)
	}
	return produced, nil
}

// fault injects one event of the schedule.
func (h *harness) fault(e event) {
	slots := h.slots
	switch e.kind {
	case "kill":
		// An armed router (relay-crash fault pending) is spared: killing it would
		// only postpone its crash point. While a relay-crash fault keeps the others down,
		// the kill waits for one of them (≤ 30 s).
		victim := killable(slots, slots[e.victim], 30*time.Second)
		if victim == nil {
			h.logf("kill: no router that is not armed ran within 30s (skipped)")
		} else if pid, ok := victim.kill(e.dur); ok {
			h.scheduledKills.Add(1)
			h.logf("SIGKILL router %s (pid %d), restart in %s", victim.name, pid, e.dur.Round(10*time.Millisecond))
		} else {
			h.logf("kill: no router running at this moment (skipped)")
		}
	case "join":
		j := slots[len(slots)-1]
		h.logf("router %s joins", j.name)
		j.start()
	case "leave":
		j := slots[len(slots)-1]
		h.logf("router %s leaves (SIGTERM)", j.name)
		j.stop(40 * time.Second)
	case "leader-kill", "coord-kill", "node-restart":
		h.clusterFault(e)
	case "db-latency", "kafka-latency", "db-reset", "kafka-reset", "db-cut", "kafka-cut":
		target, what, _ := strings.Cut(e.kind, "-")
		x := h.px
		if target == "kafka" {
			x = h.kpx
		}
		h.netFault(x, target, what, e)
	case "relay-crash":
		// Not while a service restarts (the armed router would only fail to start):
		// it holds the infra lock until the crash happened or 25 s passed.
		h.infraMu.Lock()
		h.relayCrash(e, 25*time.Second)
		h.infraMu.Unlock()
	case "kafka":
		h.restart("kafka", e.dur, &h.brokerRestarts)
	case "db":
		h.restart("db", e.dur, &h.dbRestarts)
	case "db-node-kill":
		h.dbNodeKill(e)
	}
}

// killable is the router a kill fault hits: first if it runs and is not armed, else the
// first other one that does, waiting up to wait for one; nil if none did.
func killable(slots []*slot, first *slot, wait time.Duration) *slot {
	deadline := time.Now().Add(wait)
	for {
		if first.running() && !first.isArmed() {
			return first
		}
		for _, s := range slots {
			if s.running() && !s.isArmed() {
				return s
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// netFault runs one network fault on x (the db or kafka proxy) and logs it.
func (h *harness) netFault(x *proxy, target, what string, e event) {
	if x == nil {
		return
	}
	var err error
	switch what {
	case "latency":
		h.logf("%s proxy: +%s latency per chunk each way for %s", target, e.val.Round(time.Millisecond), e.dur.Round(100*time.Millisecond))
		if err = x.SetLatency(e.val); err == nil {
			time.Sleep(e.dur)
			err = x.SetLatency(0)
		}
	case "reset":
		h.logf("%s proxy: resetting every connection that carries data in the next %s", target, e.dur.Round(100*time.Millisecond))
		err = x.Reset(e.dur)
	case "cut":
		h.logf("%s proxy: cut (all traffic dropped) for %s", target, e.dur.Round(100*time.Millisecond))
		if err = x.SetCut(true); err == nil {
			time.Sleep(e.dur)
			err = x.SetCut(false)
			h.logf("%s proxy: cut healed (connections that lived through it closed)", target)
		}
	}
	if err != nil {
		h.logf("%s proxy: %s: %v", target, what, err)
	}
}

// relayCrash makes the relay crash between a Kafka commit and the database mark, the moment
// its reconciliation exists for: the victim router restarts at once armed with
// CHAOS_RELAY_CRASH_POINT=after-kafka-commit:n (it exits with 137 right after its n-th
// Kafka commit, before marking the rows; its restarts stay armed until one does), every
// other router is SIGKILLed too and kept down until the dead owner's lease has expired, so
// the victim is the one that takes the lease.
// The next relay session (any router) must reconcile that batch rather than publish it again.
// It waits up to wait for the crash. When the lease went elsewhere all the same (the victim
// was slow to start, or a router that came back took the shard over through the membership),
// it SIGKILLs the routers that are not armed, the lease's holder among them, and keeps them
// down until the victim has crashed (at most wait again): alone, the victim takes the lease
// and every order, so its relay commits.
func (h *harness) relayCrash(e event, wait time.Duration) {
	slots := h.slots
	victim := slots[e.victim]
	n := int(e.val)
	victim.arm(fmt.Sprintf("%s=after-kafka-commit:%d", relayCrashEnv, n))
	others := leaseTTL + 1500*time.Millisecond
	var killed []string
	for _, s := range slots {
		delay := others
		if s == victim {
			delay = 300 * time.Millisecond
		} else {
			s.delayStart(time.Now().Add(others))
		}
		if pid, ok := s.kill(delay); ok {
			killed = append(killed, fmt.Sprintf("%s (pid %d)", s.name, pid))
		}
	}
	h.logf("relay crash: SIGKILL %s; router %s restarts armed to crash right after its Kafka commit #%d (before the mark), the others in %s",
		strings.Join(killed, ", "), victim.name, n, others)
	before := victim.crashCount()
	if awaitCrash(victim, before, wait) {
		return
	}
	holders := h.leaseHolders()
	killed = killed[:0]
	for _, s := range slots {
		if s == victim {
			continue
		}
		s.delayStart(time.Now().Add(wait))
		if pid, ok := s.kill(wait); ok {
			killed = append(killed, fmt.Sprintf("%s (pid %d)", s.name, pid))
		}
	}
	h.logf("relay crash: router %s did not reach its crash point within %s, the relay lease is held by %s: SIGKILL %s, kept down until %s has crashed (≤ %s) so that it takes the lease over",
		victim.name, wait, holders, strings.Join(killed, ", "), victim.name, wait)
	crashed := awaitCrash(victim, before, wait)
	for _, s := range slots {
		if s != victim {
			s.allowStart()
		}
	}
	if crashed {
		h.logf("relay crash: router %s took the lease over and crashed at its crash point; the others restart now", victim.name)
		return
	}
	h.logf("relay crash: router %s did not reach its crash point alone either (lease held by %s; its starts stay armed until one does)", victim.name, h.leaseHolders())
}

// awaitCrash waits up to wait for the slot's crash count to pass before.
func awaitCrash(s *slot, before int, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for s.crashCount() == before {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// leaseHolders says who holds the relay leases (relay_lease, direct to the database): the
// router whose process is the owner (host-pid-random), else the owner as written.
func (h *harness) leaseHolders() string {
	db, err := openDB(h.appDSN)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	err = query(ctx, db, `SELECT shard, owner FROM relay_lease ORDER BY shard`, nil, func(s scanner) error {
		var shard, owner string
		if err := s.Scan(&shard, &owner); err != nil {
			return err
		}
		who := "owner " + owner
		for _, sl := range h.slots {
			if pid := sl.pid(); pid != 0 && ownerPID(owner) == pid {
				who = fmt.Sprintf("router %s (owner %s)", sl.name, owner)
			}
		}
		out = append(out, fmt.Sprintf("%s on shard %s", who, shard))
		return nil
	})
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	if len(out) == 0 {
		return "nobody"
	}
	return strings.Join(out, ", ")
}

// ownerPID is the process id in a relay's default lease owner name (host-pid-random), 0 if
// there is none.
func ownerPID(owner string) int {
	f := strings.Split(owner, "-")
	if len(f) < 3 {
		return 0
	}
	pid, err := strconv.Atoi(f[len(f)-2])
	if err != nil {
		return 0
	}
	return pid
}

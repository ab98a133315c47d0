package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"time"
)

// profile is how long a run lasts and how many faults of each kind it injects.
type profile struct {
	name                                     string
	window                                   time.Duration // faults happen in [warmup, window]
	orders, segments                         int
	rate                                     float64 // messages/s of each produce run
	kills, joins, brokerRestarts, dbRestarts int
	minKills                                 int // kills that must really happen (a scheduled kill finds no router now and then)
	latencies, resets, cuts                  int // DB proxy faults
	kLatencies, kResets, kCuts               int // Kafka proxy faults
	relayCrashes                             int // relay crash points armed (after-kafka-commit)
	drain                                    time.Duration
}

var profiles = map[string]profile{
	"short": {name: "short", window: 100 * time.Second, orders: 3000, segments: 6, rate: 50,
		kills: 6, minKills: 5, joins: 3, brokerRestarts: 1, dbRestarts: 1, latencies: 2, resets: 2, cuts: 1,
		kLatencies: 2, kResets: 2, kCuts: 1, relayCrashes: 1, drain: 150 * time.Second},
	"long": {name: "long", window: 540 * time.Second, orders: 15000, segments: 20, rate: 45,
		kills: 24, minKills: 20, joins: 10, brokerRestarts: 3, dbRestarts: 3, latencies: 5, resets: 6, cuts: 3,
		kLatencies: 5, kResets: 6, kCuts: 3, relayCrashes: 4, drain: 300 * time.Second},
	// broken: a short run for a deliberately broken build (scripts/chaos.sh CHAOS_BROKEN=...):
	// relay crashes between the Kafka commit and the mark, a few other faults, no restarts.
	"broken": {name: "broken", window: 55 * time.Second, orders: 1800, segments: 3, rate: 50,
		kills: 2, minKills: 1, joins: 1, latencies: 1, resets: 1, kLatencies: 1, kResets: 1,
		relayCrashes: 3, drain: 120 * time.Second},
}

// leaseTTL is the relay lease of the run (chaosConfig): a relay-crash fault keeps the other
// routers down a little longer than this, so that the armed router takes the lease.
const leaseTTL = 3 * time.Second

type event struct {
	at     time.Duration
	kind   string
	victim int
	dur    time.Duration // restart delay (kill), outage (kafka, db, cut), length (latency, reset window)
	val    time.Duration // latency; for relay-crash the crash point's count
}

// schedule draws the run's faults from rng: the same seed gives the same schedule.
func schedule(p profile, rng *rand.Rand) []event {
	warm := 8 * time.Second
	span := p.window - warm - 10*time.Second
	at := func() time.Duration { return warm + time.Duration(rng.Int64N(int64(span))) }
	between := func(a, b time.Duration) time.Duration { return a + time.Duration(rng.Int64N(int64(b-a))) }
	var ev []event
	for range p.kills {
		ev = append(ev, event{at: at(), kind: "kill", victim: rng.IntN(2), dur: between(200*time.Millisecond, 3*time.Second)})
	}
	// Join/leave cycles of router c, in disjoint slices of the window.
	for i := range p.joins {
		slice := span / time.Duration(p.joins)
		j := warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/3)))
		ev = append(ev, event{at: j, kind: "join"}, event{at: j + between(slice/3, slice*2/3), kind: "leave"})
	}
	// Broker and database restarts spread over the window (one infra operation at a time).
	for i := range p.brokerRestarts {
		slice := span / time.Duration(p.brokerRestarts)
		ev = append(ev, event{at: warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/2))), kind: "kafka", dur: between(2*time.Second, 8*time.Second)})
	}
	for i := range p.dbRestarts {
		slice := span / time.Duration(p.dbRestarts)
		ev = append(ev, event{at: warm + slice*time.Duration(i) + slice/2 + time.Duration(rng.Int64N(int64(slice/3))), kind: "db", dur: between(2*time.Second, 6*time.Second)})
	}
	for _, target := range []string{"db", "kafka"} {
		lat, res, cut := p.latencies, p.resets, p.cuts
		if target == "kafka" {
			lat, res, cut = p.kLatencies, p.kResets, p.kCuts
		}
		for range lat {
			ev = append(ev, event{at: at(), kind: target + "-latency", val: between(20*time.Millisecond, 250*time.Millisecond), dur: between(4*time.Second, 10*time.Second)})
		}
		for range res {
			ev = append(ev, event{at: at(), kind: target + "-reset", dur: between(time.Second, 2*time.Second)})
		}
		for range cut {
			ev = append(ev, event{at: at(), kind: target + "-cut", dur: between(2*time.Second, 6*time.Second)})
		}
	}
	for i := range p.relayCrashes {
		// In disjoint slices (a second one would kill the first one's armed router); val
		// carries the crash point's count: the n-th Kafka commit of the armed process.
		slice := span / time.Duration(p.relayCrashes)
		ev = append(ev, event{at: warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/2))), kind: "relay-crash",
			victim: rng.IntN(2), val: time.Duration(1 + rng.IntN(3))})
	}
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].at < ev[j].at })
	return ev
}

func writeSchedule(path string, ev []event) {
	var b strings.Builder
	for _, e := range ev {
		val := e.val.Round(time.Millisecond).String()
		if e.kind == "relay-crash" {
			val = fmt.Sprintf("after-kafka-commit:%d", int(e.val))
		}
		fmt.Fprintf(&b, "%7.1fs %-13s victim=%d dur=%s val=%s\n", e.at.Seconds(), e.kind, e.victim, e.dur.Round(time.Millisecond), val)
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}

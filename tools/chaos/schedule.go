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

	// On the three-broker cluster (scripts/infra.sh INFRA_KAFKA_BROKERS=3): no Kafka proxy,
	// brokers SIGKILLed instead of the one broker's restarts.
	cluster      bool
	routers      int     // routers always wanted (0: 2, a and b); one more joins and leaves
	shards       int     // relay.shards (0: the default, 1)
	leaderKills  int     // SIGKILLs of the leader of most order-paid partitions, and as many of coupon-granted's
	coordKills   int     // SIGKILLs of the transaction coordinator of a relay shard's transactional id
	nodeRestarts int     // controlled restarts (SIGTERM) of a cluster node
	dupRate      float64 // produce --dup-rate (0: 0.3)
	// churn > 0: instead of join/leave faults, a router joins and leaves every churn while the
	// producer sends (a rebalance at least that often); rssEvery > 0: the routers' RSS is
	// sampled that often (rss.csv).
	churn, rssEvery time.Duration
	noMisbehaver    bool // only the coupon granter (the misbehaving plugin's blocked calls are leaked goroutines by design)

	// galera: the database is the chaos instance's Galera cluster, reached directly (no DB
	// proxy, no DB network faults or restarts); dbNodeKills SIGKILLs of the node the routers
	// write to, each rejoining before the next.
	galera      bool
	dbNodeKills int
}

func (p profile) alwaysOn() int { return max(p.routers, 2) }

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
	// cluster: three routers and relays over two outbox shards on the three-broker cluster;
	// leaders of order-paid and coupon-granted and the relays' transaction coordinators
	// SIGKILLed, controlled broker restarts, router kills, a database restart.
	"cluster": {name: "cluster", window: 180 * time.Second, orders: 4000, segments: 8, rate: 60,
		kills: 8, minKills: 6, joins: 3, dbRestarts: 1, latencies: 2, resets: 2, cuts: 1, relayCrashes: 1,
		drain: 240 * time.Second, cluster: true, routers: 3, shards: 2, leaderKills: 2, coordKills: 2, nodeRestarts: 2},
	// galera: the short profile's router and Kafka faults on the Galera cluster, the write
	// node killed three times.
	"galera": {name: "galera", window: 100 * time.Second, orders: 3000, segments: 6, rate: 50,
		kills: 6, minKills: 5, joins: 3, brokerRestarts: 1, kLatencies: 2, kResets: 2, kCuts: 1, relayCrashes: 1,
		drain: 150 * time.Second, galera: true, dbNodeKills: 3},
}

// soakProfile is `make soak`: orders (default 1,000,000) over minutes (default 30) on the
// cluster, 20 % duplicate deliveries, ≥ 20 router kills, a router joining or leaving every
// 4 s, broker kills, the routers' RSS sampled every 10 s.
func soakProfile(orders int, window time.Duration) profile {
	segs := max(1, orders/5000)
	msgs := float64(orders) * 1.21 // duplicates and poison
	kills := max(24, int(window/time.Minute))
	return profile{name: "soak", window: window, orders: orders, segments: segs, rate: msgs / window.Seconds(),
		kills: kills, minKills: 20, dbRestarts: 2, latencies: 3, resets: 3, cuts: 1, relayCrashes: 2,
		drain: 15 * time.Minute, cluster: true, routers: 3, shards: 2, leaderKills: 3, coordKills: 3, nodeRestarts: 2,
		dupRate: 0.2, churn: 4 * time.Second, rssEvery: 10 * time.Second, noMisbehaver: true}
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
		ev = append(ev, event{at: at(), kind: "kill", victim: rng.IntN(p.alwaysOn()), dur: between(200*time.Millisecond, 3*time.Second)})
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
	// Cluster faults (drawn after the others: the other profiles' schedules are unchanged),
	// spread over the window; they take turns with the other infra operations. val of a
	// leader kill: 0 order-paid, 1 coupon-granted.
	var brokerEv []event
	for i := range p.leaderKills * 2 {
		brokerEv = append(brokerEv, event{kind: "leader-kill", val: time.Duration(i % 2), dur: between(2*time.Second, 6*time.Second)})
	}
	for range p.coordKills {
		brokerEv = append(brokerEv, event{kind: "coord-kill", victim: rng.IntN(max(p.shards, 1)), dur: between(2*time.Second, 6*time.Second)})
	}
	for range p.nodeRestarts {
		brokerEv = append(brokerEv, event{kind: "node-restart", victim: 1 + rng.IntN(3), dur: between(2*time.Second, 5*time.Second)})
	}
	rng.Shuffle(len(brokerEv), func(i, j int) { brokerEv[i], brokerEv[j] = brokerEv[j], brokerEv[i] })
	for i := range brokerEv {
		slice := span / time.Duration(len(brokerEv))
		brokerEv[i].at = warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/3)))
	}
	ev = append(ev, brokerEv...)
	// Galera node kills (drawn last), in disjoint slices: a node rejoins before the next.
	for i := range p.dbNodeKills {
		slice := span / time.Duration(p.dbNodeKills)
		ev = append(ev, event{at: warm + slice*time.Duration(i) + time.Duration(rng.Int64N(int64(slice/3))), kind: "db-node-kill",
			dur: between(2*time.Second, 5*time.Second)})
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

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// The scaleout group's load and schedule. Two routers consume at scaleoutRate; the measured
// load runs scaleoutSeconds; a third router starts scaleoutJoinAt into it and is stopped
// (SIGTERM: it leaves the group) at scaleoutLeaveAt.
const (
	scaleoutRate    = 5000
	scaleoutWarm    = 3 * time.Second
	scaleoutSeconds = 24
	scaleoutJoinAt  = 6 * time.Second
	scaleoutLeaveAt = 15 * time.Second
	// scaleoutStalled is the stall above which a partition counts in stalled_partitions.
	scaleoutStalled = 500 * time.Millisecond
)

// scaleoutOrder is the strategies' order: one round of each, the second round in the
// opposite order, so neither always runs on the warmer broker.
var scaleoutOrder = []string{"cooperative-sticky", "range", "range", "cooperative-sticky"}

// scaleoutGroup measures what a router joining and leaving a running group costs, with
// kafka.balance_strategies cooperative-sticky (the default: incremental rebalancing)
// against range (eager). Each run: two router binaries (bin/router, as the router group
// runs them) on fresh topics of -e2e-partitions partitions and a consumer group of their
// own; once the group is stable with both and every partition assigned, the e2e generator
// offers scaleoutRate orders/s, scaleoutWarm unmeasured and then scaleoutSeconds measured; a
// third router starts scaleoutJoinAt into the measured load and is stopped at
// scaleoutLeaveAt. Per run:
//
//   - max_stall_ms: the longest time any input partition made no progress while records of
//     it were waiting. A record waits from its Kafka timestamp (the moment it was due) until
//     its inbox row is written (created_at: the delivery was claimed); a partition
//     progresses when a record of it is claimed for the first time (a redelivery is no
//     progress). steady_, join_ and leave_stall_ms split it by when the stall ended: before
//     the third router started, while it ran, after it was stopped;
//     stalled_partitions is how many partitions stalled longer than scaleoutStalled in the
//     join or the leave phase;
//   - p50_ms, p99_ms: from an order's Kafka timestamp to its event visible to a
//     read_committed consumer, over every measured order (join and leave included);
//   - redelivered: deliveries the inbox counted as duplicates (no order is sent twice, so
//     each is a redelivery after a rebalance);
//   - joined_ms, left_ms: from the third router's start to the group's third member, and
//     from its stop to the group stable with two again.
//
// Each partition's worst stall at the join or the leave is printed too, with when it began.
//
// Every order must be granted and published. Then one untagged line per strategy with the
// medians, and the ratio of range's to cooperative-sticky's.
func (s *suite) scaleoutGroup(ctx context.Context) error {
	bin, err := filepath.Abs(s.cfg.routerBin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("scaleout: %v (build it: make build)", err)
	}
	runs := map[string][]scaleoutRun{}
	for i, strategy := range scaleoutOrder {
		s.round = i + 1
		r, err := s.scaleoutRun(ctx, bin, strategy, i+1)
		if err != nil {
			s.round = 0
			return fmt.Errorf("scaleout %s: %w", strategy, err)
		}
		s.report("scaleout", r.fields()...)
		runs[strategy] = append(runs[strategy], r)
	}
	s.round = 0
	med := map[string]map[string]float64{}
	for _, strategy := range []string{"cooperative-sticky", "range"} {
		m := map[string]float64{}
		for _, k := range []string{"max_stall_ms", "join_stall_ms", "leave_stall_ms", "steady_stall_ms", "p50_ms", "p99_ms", "orders_per_s", "redelivered", "stalled_partitions"} {
			var xs []float64
			for _, r := range runs[strategy] {
				xs = append(xs, r.num[k])
			}
			m[k] = median(xs)
		}
		med[strategy] = m
		s.report("scaleout", "strategy", strategy, "runs", len(runs[strategy]), "offered_per_s", scaleoutRate, "orders_per_s", m["orders_per_s"],
			"max_stall_ms", m["max_stall_ms"], "join_stall_ms", m["join_stall_ms"], "leave_stall_ms", m["leave_stall_ms"], "steady_stall_ms", m["steady_stall_ms"],
			"stalled_partitions", m["stalled_partitions"], "p50_ms", m["p50_ms"], "p99_ms", m["p99_ms"], "redelivered", m["redelivered"])
	}
	ratio := func(k string) float64 {
		if med["cooperative-sticky"][k] <= 0 {
			return 0
		}
		return med["range"][k] / med["cooperative-sticky"][k]
	}
	s.report("scaleout", "mode", "range_vs_cooperative", "max_stall_ratio", ratio("max_stall_ms"), "join_stall_ratio", ratio("join_stall_ms"),
		"leave_stall_ratio", ratio("leave_stall_ms"), "p99_ratio", ratio("p99_ms"))
	return nil
}

// scaleoutRun is one run's figures, in the order reported.
type scaleoutRun struct {
	keys []string
	num  map[string]float64
	tags []any
}

func (r *scaleoutRun) set(k string, v float64) {
	if _, ok := r.num[k]; !ok {
		r.keys = append(r.keys, k)
	}
	r.num[k] = v
}

func (r scaleoutRun) fields() []any {
	kv := slices.Clone(r.tags)
	for _, k := range r.keys {
		v := r.num[k]
		if v == float64(int64(v)) && !strings.HasSuffix(k, "_ms") && !strings.HasSuffix(k, "_per_s") {
			kv = append(kv, k, int64(v))
		} else {
			kv = append(kv, k, v)
		}
	}
	return kv
}

func (s *suite) scaleoutRun(ctx context.Context, bin, strategy string, run int) (scaleoutRun, error) {
	res := scaleoutRun{num: map[string]float64{}, tags: []any{"strategy", strategy, "offered_per_s", scaleoutRate}}
	in, out, clean, err := s.routerTopics(ctx)
	if err != nil {
		return res, err
	}
	defer clean()
	w, err := watch(s.kc, out)
	if err != nil {
		return res, err
	}
	defer w.close()
	producer, err := s.kc.NewSyncProducer()
	if err != nil {
		return res, err
	}
	defer producer.Close()

	// The routers run with the strategy; the rest of their environment is -router-env's.
	rs := *s
	cfg := *s.cfg
	cfg.routerEnv = strings.Trim(cfg.routerEnv+",ONCEFLOW_KAFKA_BALANCE_STRATEGIES="+strategy, ",")
	rs.cfg = &cfg
	short := map[string]string{"cooperative-sticky": "coop", "range": "range"}[strategy]
	var routers []*child
	defer func() {
		for _, c := range routers {
			_ = c.stop()
		}
	}()
	group := routerGroupName(in)
	for i := range 2 {
		c, err := rs.startRouter(bin, fmt.Sprintf("scaleout-%s-%d-%c", short, run, 'a'+i), in, out)
		if err != nil {
			return res, err
		}
		routers = append(routers, c)
	}
	if err := waitMembers(s.kc, group, in, 2, s.cfg.e2eParts, 2*time.Minute, routers...); err != nil {
		return res, err
	}
	members := watchMembers(s.kc, group)
	defer members.stop()

	e := &e2eRun{s: s}
	warm, count := int(scaleoutRate*scaleoutWarm.Seconds()), scaleoutRate*scaleoutSeconds
	if err := e.produceOrders(producer, in, "sowarm", 0, warm, scaleoutRate); err != nil {
		return res, err
	}
	t0 := time.Now()
	produced := make(chan error, 1)
	go func() { produced <- e.produceOrders(producer, in, "so", 0, count, scaleoutRate) }()

	time.Sleep(time.Until(t0.Add(scaleoutJoinAt)))
	joinAt := time.Now()
	third, err := rs.startRouter(bin, fmt.Sprintf("scaleout-%s-%d-c", short, run), in, out)
	if err != nil {
		return res, err
	}
	routers = append(routers, third)
	time.Sleep(time.Until(t0.Add(scaleoutLeaveAt)))
	leaveAt := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- third.stop() }()

	if err := <-produced; err != nil {
		return res, err
	}
	if err := <-stopped; err != nil {
		return res, fmt.Errorf("the third router: %w", err)
	}
	if err := routers[0].waitSeen(w, warm+count, 5*time.Minute); err != nil {
		return res, err
	}
	elapsed := time.Since(t0)
	for _, c := range routers {
		if err := c.stop(); err != nil {
			return res, err
		}
	}
	if err := checkGranted(ctx, s.db, warm+count); err != nil {
		return res, err
	}
	members.stop()

	recs, err := s.kc.ReadAll(ctx, in, 2*time.Second)
	if err != nil {
		return res, err
	}
	claimed, err := s.claimedAt(ctx, in)
	if err != nil {
		return res, err
	}
	st := partitionStalls(recs, claimed, joinAt, leaveAt)
	for _, p := range st.worst {
		fmt.Printf("bench: scaleout %s run %d: partition %d stalled %.0f ms from %+.2f s (third router started at %+.2f s, stopped at %+.2f s)\n",
			strategy, run, p.partition, ms(p.d), p.from.Sub(t0).Seconds(), joinAt.Sub(t0).Seconds(), leaveAt.Sub(t0).Seconds())
	}
	var lat []float64
	for _, r := range recs {
		if !strings.HasPrefix(r.Key, "so-") {
			continue
		}
		if at, ok := w.at(r.Key); ok {
			lat = append(lat, float64(at.Sub(r.Timestamp).Microseconds())/1000)
		}
	}
	if len(lat) == 0 {
		return res, fmt.Errorf("no latency measured")
	}
	sort.Float64s(lat)
	var redelivered int
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(duplicates), 0) FROM inbox").Scan(&redelivered); err != nil {
		return res, err
	}
	res.set("orders_per_s", float64(count)/elapsed.Seconds())
	res.set("max_stall_ms", ms(st.max))
	res.set("steady_stall_ms", ms(st.steady))
	res.set("join_stall_ms", ms(st.join))
	res.set("leave_stall_ms", ms(st.leave))
	res.set("stalled_partitions", float64(st.stalled))
	res.set("p50_ms", lat[len(lat)/2])
	res.set("p99_ms", lat[min(len(lat)-1, len(lat)*99/100)])
	res.set("redelivered", float64(redelivered))
	res.set("joined_ms", ms(members.first(3, joinAt).Sub(joinAt)))
	res.set("left_ms", ms(members.stableWith(2, leaveAt).Sub(leaveAt)))
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// claimedAt is when each record of topic was first claimed: its inbox row's created_at,
// by partition and offset.
func (s *suite) claimedAt(ctx context.Context, topic string) (map[[2]int64]time.Time, error) {
	rows, err := s.db.QueryContext(ctx, s.dialect.Rebind("SELECT kafka_partition, kafka_offset, created_at FROM inbox WHERE topic = ?"), topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[[2]int64]time.Time{}
	for rows.Next() {
		var p, off int64
		var at time.Time
		if err := rows.Scan(&p, &off, &at); err != nil {
			return nil, err
		}
		out[[2]int64{p, off}] = at
	}
	return out, rows.Err()
}

// stalls are the longest times without progress of a run's partitions.
type stalls struct {
	max, steady, join, leave time.Duration
	stalled                  int // partitions that stalled over scaleoutStalled in the join or leave phase
	worst                    []stall
}

// stall is a partition's longest stall in the join or leave phase.
type stall struct {
	partition int32
	from      time.Time
	d         time.Duration
}

// partitionStalls finds, per partition, the longest time no record of it was claimed while
// one waited: a record waits from its Kafka timestamp until it is claimed. A stall counts in
// the phase in which it ended: before joinAt, before leaveAt, or after.
func partitionStalls(recs []kafkax.Record, claimed map[[2]int64]time.Time, joinAt, leaveAt time.Time) stalls {
	type ev struct {
		at      time.Time
		claimed bool
	}
	byPart := map[int32][]ev{}
	for _, r := range recs {
		at, ok := claimed[[2]int64{int64(r.Partition), r.Offset}]
		if !ok {
			continue // not an order of the run (the topic has none other)
		}
		byPart[r.Partition] = append(byPart[r.Partition], ev{r.Timestamp, false}, ev{at, true})
	}
	var out stalls
	for p, evs := range byPart {
		// At one instant, arrivals before claims: a record due and claimed at once waited 0.
		sort.Slice(evs, func(i, j int) bool {
			if !evs[i].at.Equal(evs[j].at) {
				return evs[i].at.Before(evs[j].at)
			}
			return !evs[i].claimed && evs[j].claimed
		})
		waiting := 0
		var since time.Time // the last progress, or when a record began to wait with none waiting
		worst := stall{partition: p}
		for _, e := range evs {
			if !e.claimed {
				if waiting == 0 {
					since = e.at
				}
				waiting++
				continue
			}
			if waiting > 0 {
				d := e.at.Sub(since)
				out.max = max(out.max, d)
				switch {
				case e.at.Before(joinAt):
					out.steady = max(out.steady, d)
				case e.at.Before(leaveAt):
					out.join = max(out.join, d)
				default:
					out.leave = max(out.leave, d)
				}
				if !e.at.Before(joinAt) && d > worst.d {
					worst.from, worst.d = since, d
				}
				waiting--
			}
			since = e.at
		}
		if worst.d > scaleoutStalled {
			out.stalled++
		}
		out.worst = append(out.worst, worst)
	}
	slices.SortFunc(out.worst, func(a, b stall) int { return int(a.partition - b.partition) })
	return out
}

// waitMembers waits until group is Stable with n members that have every one of topic's
// parts partitions assigned. A cooperative group is Stable with its new member before the
// revoked partitions are assigned again, in a second join.
func waitMembers(kc kafkax.Config, group, topic string, n, parts int, limit time.Duration, cs ...*child) error {
	admin, err := groupAdmin(kc)
	if err != nil {
		return err
	}
	defer admin.Close()
	for deadline := time.Now().Add(limit); ; time.Sleep(100 * time.Millisecond) {
		if state, members, err := describeGroup(admin, group); err == nil && state == "Stable" && members == n && assigned(admin, group, topic) == parts {
			return nil
		}
		for _, c := range cs {
			select {
			case <-c.exited:
				return fmt.Errorf("a router exited (%v) before its group %s was stable; its log: %s%s", c.waitErr, group, c.logPath, c.logTail())
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer group %s not stable with %d members after %s", group, n, limit)
		}
	}
}

func groupAdmin(kc kafkax.Config) (sarama.ClusterAdmin, error) {
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	admin, err := sarama.NewClusterAdmin(kc.Brokers, sc)
	if err != nil {
		return nil, kafkax.Unreachable(kc.Brokers, err)
	}
	return admin, nil
}

func describeGroup(admin sarama.ClusterAdmin, group string) (string, int, error) {
	gs, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return "", 0, err
	}
	if len(gs) != 1 {
		return "", 0, fmt.Errorf("group %s: %d descriptions", group, len(gs))
	}
	return gs[0].State, len(gs[0].Members), nil
}

// assigned is how many of topic's partitions group's members have assigned.
func assigned(admin sarama.ClusterAdmin, group, topic string) int {
	gs, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(gs) != 1 {
		return 0
	}
	n := 0
	for _, m := range gs[0].Members {
		if a, err := m.GetMemberAssignment(); err == nil && a != nil {
			n += len(a.Topics[topic])
		}
	}
	return n
}

// memberLog samples a group's state and members every 50 ms.
type memberLog struct {
	mu      sync.Mutex
	samples []memberSample
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

type memberSample struct {
	at      time.Time
	state   string
	members int
}

func watchMembers(kc kafkax.Config, group string) *memberLog {
	l := &memberLog{done: make(chan struct{})}
	admin, err := groupAdmin(kc)
	if err != nil {
		return l
	}
	l.wg.Go(func() {
		defer admin.Close()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if state, n, err := describeGroup(admin, group); err == nil {
				l.mu.Lock()
				l.samples = append(l.samples, memberSample{time.Now(), state, n})
				l.mu.Unlock()
			}
			select {
			case <-l.done:
				return
			case <-t.C:
			}
		}
	})
	return l
}

func (l *memberLog) stop() {
	l.once.Do(func() { close(l.done) })
	l.wg.Wait()
}

// first is the first sample after from with n members; from itself when there is none.
func (l *memberLog) first(n int, from time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.samples {
		if s.at.After(from) && s.members == n {
			return s.at
		}
	}
	return from
}

// stableWith is the first sample after from that is Stable with n members; from itself
// when there is none.
func (l *memberLog) stableWith(n int, from time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.samples {
		if s.at.After(from) && s.members == n && s.state == "Stable" {
			return s.at
		}
	}
	return from
}

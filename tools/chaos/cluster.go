package main

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
)

// clusterCounts are the cluster faults that happened (profiles with cluster set).
type clusterCounts struct {
	LeaderKills    map[string]int `json:"leader_kills"` // by topic
	CoordKills     int            `json:"coordinator_kills"`
	MidTxnKills    int            `json:"mid_transaction_kills"` // kills while the outbox had unpublished rows
	NodeRestarts   int            `json:"node_restarts"`         // controlled (SIGTERM)
	Rebalances     int            `json:"rebalances,omitempty"`  // churn joins and leaves
	RSSMaxMB       float64        `json:"rss_max_mb,omitempty"`
	RSSGrowthMB    float64        `json:"rss_growth_mb_per_100k,omitempty"`
	RSSBuckets     []string       `json:"rss_buckets,omitempty"` // max RSS per 100k orders processed
	RSSSamples     int            `json:"rss_samples,omitempty"`
	Processed      int64          `json:"orders_processed,omitempty"`
	BrokerRSSMaxMB float64        `json:"broker_rss_max_mb,omitempty"`
}

func (c clusterCounts) brokerKills() int {
	n := c.CoordKills
	for _, k := range c.LeaderKills {
		n += k
	}
	return n
}

// clusterState is what the cluster faults share.
type clusterState struct {
	mu     sync.Mutex
	counts clusterCounts
	churns atomic.Int64
}

// clusterFault SIGKILLs the broker that leads most partitions of order-paid or
// coupon-granted, or the transaction coordinator of a relay shard's transactional id, or
// restarts a node gracefully; the node (broker id = node number, scripts/infra-cluster.sh)
// is started again after the event's outage.
func (h *harness) clusterFault(e event) {
	h.infraMu.Lock()
	defer h.infraMu.Unlock()
	var node int32
	var what, topic string
	switch e.kind {
	case "leader-kill":
		topic = orderTopic
		if e.val == 1 {
			topic = grantedTopic
		}
		id, led, parts, err := topLeader(h.o.brokers, topic)
		if err != nil {
			h.logf("leader kill (%s): %v (skipped)", topic, err)
			return
		}
		node, what = id, fmt.Sprintf("leader of %d/%d %s partitions", led, parts, topic)
	case "coord-kill":
		txn := h.shardTxnID(e.victim)
		id, err := txnCoordinator(h.o.brokers, txn)
		if err != nil {
			h.logf("coordinator kill (%s): %v (skipped)", txn, err)
			return
		}
		node, what = id, "transaction coordinator of "+txn
	case "node-restart":
		node, what = int32(e.victim), "controlled restart"
	}
	n := strconv.Itoa(int(node))
	pending := h.unpublished()
	if e.kind == "node-restart" {
		h.logf("broker %s: SIGTERM (%s), down for %s", n, what, e.dur.Round(100*time.Millisecond))
		if err := h.infra("cluster-stop", n); err != nil {
			h.harnessErr("cluster-stop %s: %v (see infra.log)", n, err)
		}
	} else {
		if err := h.infra("cluster-kill", n); err != nil {
			h.harnessErr("cluster-kill %s: %v (see infra.log)", n, err)
			return
		}
		mid := ""
		if pending > 0 {
			mid = fmt.Sprintf(", mid-transaction: %d outbox rows unpublished", pending)
		}
		h.logf("SIGKILL broker %s (%s%s), down for %s", n, what, mid, e.dur.Round(100*time.Millisecond))
	}
	h.cl.mu.Lock()
	switch e.kind {
	case "leader-kill":
		if h.cl.counts.LeaderKills == nil {
			h.cl.counts.LeaderKills = map[string]int{}
		}
		h.cl.counts.LeaderKills[topic]++
	case "coord-kill":
		h.cl.counts.CoordKills++
	case "node-restart":
		h.cl.counts.NodeRestarts++
	}
	if e.kind != "node-restart" && pending > 0 {
		h.cl.counts.MidTxnKills++
	}
	h.cl.mu.Unlock()
	time.Sleep(e.dur)
	for i := 0; ; i++ {
		err := h.infra("cluster-start", n)
		if err == nil {
			break
		}
		if i == 2 {
			h.harnessErr("cluster-start %s failed 3 times: %v (see infra.log)", n, err)
			return
		}
		time.Sleep(2 * time.Second)
	}
	// The next broker fault waits until every replica is back in sync (bounded): one
	// broker down at a time, as min.insync.replicas=2 of three allows.
	t0 := time.Now()
	if err := waitInSync(h.o.brokers, 90*time.Second); err != nil {
		h.logf("broker %s back up; replicas not all in sync: %v", n, err)
	} else {
		h.logf("broker %s back up, all replicas in sync after %s", n, time.Since(t0).Round(100*time.Millisecond))
	}
}

// shardTxnID is the transactional id of relay shard i (outbox.shardTxnID's form).
func (h *harness) shardTxnID(i int) string {
	id := "onceflow-relay-" + h.info.Prefix
	if n := max(h.p.shards, 1); n > 1 {
		return fmt.Sprintf("%s-%dof%d", id, i%n, n)
	}
	return id
}

// unpublished is the number of outbox rows not yet published (direct to MariaDB), -1 when
// it cannot be read.
func (h *harness) unpublished() int {
	db, err := openDB(h.appDSN)
	if err != nil {
		return -1
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM outbox WHERE published_at IS NULL`).Scan(&n); err != nil {
		return -1
	}
	return n
}

func clusterAdmin(brokers []string) (sarama.ClusterAdmin, error) {
	sc := saramaConfig()
	sc.Net.DialTimeout = 2 * time.Second
	sc.Net.ReadTimeout = 5 * time.Second
	return sarama.NewClusterAdmin(brokers, sc)
}

// topLeader is the broker that leads most partitions of topic (DescribeTopics), with how
// many it leads.
func topLeader(brokers []string, topic string) (int32, int, int, error) {
	admin, err := clusterAdmin(brokers)
	if err != nil {
		return 0, 0, 0, err
	}
	defer admin.Close()
	md, err := admin.DescribeTopics([]string{topic})
	if err != nil {
		return 0, 0, 0, err
	}
	if len(md) != 1 || md[0].Err != sarama.ErrNoError {
		return 0, 0, 0, fmt.Errorf("describe %s: %v", topic, md)
	}
	led := map[int32]int{}
	for _, p := range md[0].Partitions {
		if p.Leader >= 0 {
			led[p.Leader]++
		}
	}
	var ids []int32
	for id := range led {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return 0, 0, 0, fmt.Errorf("no leader of %s", topic)
	}
	sort.Slice(ids, func(i, j int) bool { return led[ids[i]] > led[ids[j]] || led[ids[i]] == led[ids[j]] && ids[i] < ids[j] })
	return ids[0], led[ids[0]], len(md[0].Partitions), nil
}

// txnCoordinator is the broker coordinating transactional id txn (FindCoordinator of
// type transaction).
func txnCoordinator(brokers []string, txn string) (int32, error) {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return 0, err
	}
	defer client.Close()
	b, err := client.TransactionCoordinator(txn)
	if err != nil {
		return 0, err
	}
	return b.ID(), nil
}

// waitInSync waits until every partition of every topic has all its replicas in sync.
func waitInSync(brokers []string, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		under, err := underReplicated(brokers)
		if err == nil && under == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("%d partitions under-replicated after %s", under, bound)
		}
		time.Sleep(time.Second)
	}
}

func underReplicated(brokers []string) (int, error) {
	admin, err := clusterAdmin(brokers)
	if err != nil {
		return 0, err
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		return 0, err
	}
	var names []string
	for t := range topics {
		names = append(names, t)
	}
	md, err := admin.DescribeTopics(names)
	if err != nil {
		return 0, err
	}
	under := 0
	for _, t := range md {
		for _, p := range t.Partitions {
			if len(p.Isr) < len(p.Replicas) || p.Leader < 0 {
				under++
			}
		}
	}
	return under, nil
}

// churn makes router slot d join and leave, one or the other every every, until stop is
// closed: a rebalance of the group at least that often.
func (h *harness) churn(every time.Duration, stop <-chan struct{}) {
	d := h.slots[len(h.slots)-1]
	for i := 0; ; i++ {
		t0 := time.Now()
		if i%2 == 0 {
			d.start()
		} else {
			d.stop(40 * time.Second)
		}
		h.cl.churns.Add(1)
		select {
		case <-stop:
			d.stop(40 * time.Second)
			return
		case <-time.After(every - time.Since(t0)):
		}
	}
}

// sampleRSS writes the routers' RSS every every into rss.csv (seconds, orders processed so far,
// router, pid, RSS in MB) until stop is closed, and the brokers' too.
func (h *harness) sampleRSS(every time.Duration, stop <-chan struct{}) {
	f, err := os.Create(filepath.Join(h.o.runDir, "rss.csv"))
	if err != nil {
		h.logf("rss: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, "seconds,orders_processed,process,pid,rss_mb")
	db, err := openDB(h.appDSN)
	if err != nil {
		return
	}
	defer db.Close()
	t0 := time.Now()
	buckets := map[int64]float64{}
	var rows int64
	for {
		select {
		case <-stop:
			h.summarizeRSS(buckets, rows)
			return
		case <-time.After(every):
		}
		var r sql.NullInt64
		// Orders processed: every order has its grant row from its first delivery on (inbox
		// ids are no measure: a duplicate delivery's claim uses one up too).
		if err := db.QueryRow(`SELECT COUNT(*) FROM coupon_grant`).Scan(&r); err == nil && r.Valid {
			rows = r.Int64
		}
		for _, s := range h.slots {
			s.mu.Lock()
			pid := 0
			if s.cmd != nil && s.cmd.Process != nil {
				pid = s.cmd.Process.Pid
			}
			s.mu.Unlock()
			if pid == 0 {
				continue
			}
			mb := rssMB(pid)
			if mb <= 0 {
				continue
			}
			fmt.Fprintf(f, "%.0f,%d,router-%s,%d,%.1f\n", time.Since(t0).Seconds(), rows, s.name, pid, mb)
			b := rows / 100000
			buckets[b] = max(buckets[b], mb)
			h.cl.mu.Lock()
			h.cl.counts.RSSSamples++
			h.cl.counts.RSSMaxMB = max(h.cl.counts.RSSMaxMB, mb)
			h.cl.mu.Unlock()
		}
		for n := 1; n <= 3; n++ {
			if pid := brokerPID(h.o.brokers, n); pid > 0 {
				mb := rssMB(pid)
				fmt.Fprintf(f, "%.0f,%d,broker-%d,%d,%.1f\n", time.Since(t0).Seconds(), rows, n, pid, mb)
				h.cl.mu.Lock()
				h.cl.counts.BrokerRSSMaxMB = max(h.cl.counts.BrokerRSSMaxMB, mb)
				h.cl.mu.Unlock()
			}
		}
	}
}

// summarizeRSS: the routers' highest RSS per 100k orders processed and its growth per 100k orders
// (last full bucket's max minus the first's, over the buckets between).
func (h *harness) summarizeRSS(buckets map[int64]float64, rows int64) {
	var keys []int64
	for k := range buckets {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	h.cl.mu.Lock()
	defer h.cl.mu.Unlock()
	h.cl.counts.Processed = rows
	h.cl.counts.RSSBuckets = nil
	for _, k := range keys {
		h.cl.counts.RSSBuckets = append(h.cl.counts.RSSBuckets, fmt.Sprintf("%dk:%.0f", k*100, buckets[k]))
	}
	if len(keys) >= 2 {
		first, last := keys[0], keys[len(keys)-1]
		h.cl.counts.RSSGrowthMB = (buckets[last] - buckets[first]) / float64(last-first)
	}
	h.logf("router RSS: max %.0f MB over %d samples; max per 100k orders processed %s; growth %.1f MB per 100k orders; brokers' max %.0f MB",
		h.cl.counts.RSSMaxMB, h.cl.counts.RSSSamples, strings.Join(h.cl.counts.RSSBuckets, " "), h.cl.counts.RSSGrowthMB, h.cl.counts.BrokerRSSMaxMB)
}

func rssMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// brokerPID is the pid of the kafka.Kafka listening on the port of node n (brokers[n-1]).
func brokerPID(brokers []string, n int) int {
	if n > len(brokers) {
		return 0
	}
	props := brokerOrigin(brokers[n-1])
	if props == "" {
		return 0
	}
	pidf := filepath.Join(filepath.Dir(props), "kafka.pid")
	b, err := os.ReadFile(pidf)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

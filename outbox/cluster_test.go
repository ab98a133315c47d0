package outbox_test

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestEOSRelayClusterLeaderKilledMidTransaction runs the exactly-once relay on a private
// three-broker cluster while writers keep committing events. The brokers are child
// processes of this test, with replication factor 3 and min.insync.replicas 2. The test
// kills brokers with SIGKILL in the middle of the relay's Kafka transactions. It does so
// from the relay's before-kafka-commit hook, after the batch's records were sent and before
// the commit. It first kills the leader of most of the topic's partitions, then the
// transaction coordinator of the relay's transactional id. It restarts each a few seconds
// later. A read_committed consumer then sees every committed event exactly once, in
// per-key order. The relay created its positions topic with three replicas and
// min.insync.replicas 2.
func TestEOSRelayClusterLeaderKilledMidTransaction(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	if runWithoutRace(t) { // Sarama's error paths race (IBM/sarama#2913)
		return
	}
	d := testenv.DB(t, 12)
	pc := testenv.StartPrivateCluster(t, 3)
	k := pc.Config()
	topic := clusterTopic(t, k, "outbox-cluster", 6, 3)
	positions := "relay-positions-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	// victim, when set, is killed at the next before-kafka-commit, and killed then holds it.
	var victim, killed atomic.Pointer[testenv.PrivateKafka]
	var inFlight atomic.Int64 // records sent in the transaction the kill interrupted
	var sent atomic.Int64
	cfg := eosConfig(t, k, outbox.RelayConfig{BatchSize: 50, PollInterval: 5 * time.Millisecond, Linger: 5 * time.Millisecond,
		RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: time.Second, TxnTimeout: 20 * time.Second, PositionsTopic: positions,
		Tune: func(sc *sarama.Config) {
			sc.Net.DialTimeout = 2 * time.Second
			sc.Net.ReadTimeout, sc.Net.WriteTimeout = 5*time.Second, 5*time.Second
		},
		Hook: func(point string) {
			if point != "before-kafka-commit" {
				return
			}
			sent.Add(1)
			if v := victim.Swap(nil); v != nil {
				inFlight.Store(sent.Load())
				v.Kill()
				killed.Store(v)
			}
		}})
	relay := newEOSRelay(t, d.DB, k, cfg)
	stop := runRelay(t, relay)
	pw := startPacedWriters(t, d.DB, topic, 4, 10*time.Millisecond)

	kill := func(what string, id int32) {
		t.Helper()
		node := pc.Node(id)
		if node == nil {
			t.Fatalf("%s: broker %d is not a node of the cluster", what, id)
		}
		killed.Store(nil)
		victim.Store(node)
		waitFor(t, 60*time.Second, "a relay transaction to kill broker "+strconv.Itoa(int(id))+" in", func() bool { return killed.Load() != nil })
		t.Logf("SIGKILLed broker %d (%s) before the commit of the relay's transaction #%d; %d events published so far", id, what, inFlight.Load(), relay.Published())
		time.Sleep(3 * time.Second)
		node.Start()
		t.Logf("broker %d back", id)
	}

	waitFor(t, 90*time.Second, "the relay to publish before the first kill", func() bool { return relay.Published() > 0 })
	kill("leader of most "+topic+" partitions", topLeaderOf(t, k, topic))
	waitFor(t, 90*time.Second, "the relay to publish again", func() bool { return relay.Published() > int64(pw.count()/2) })
	kill("transaction coordinator of "+relay.TransactionalID(), coordinatorOf(t, k, relay.TransactionalID()))
	time.Sleep(2 * time.Second) // events keep coming after the second restart
	ids := pw.finish(t)
	if errs := pw.failed(); len(errs) > 0 {
		t.Fatalf("business transactions failed: %v", errs)
	}
	waitAllPublished(t, d.DB, len(ids), 90*time.Second)
	stop()
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	assertPerKeyOrder(t, d.DB, recs)
	t.Logf("%d events, each once on Kafka (read_committed), after two brokers were killed mid-transaction", len(ids))

	admin := clusterAdmin(t, k)
	md, err := admin.DescribeTopics([]string{positions})
	if err != nil || len(md) != 1 || len(md[0].Partitions) != 1 {
		t.Fatalf("describe %s: %v %v", positions, md, err)
	}
	if rf := len(md[0].Partitions[0].Replicas); rf != 3 {
		t.Errorf("positions topic %s created with replication factor %d, want 3", positions, rf)
	}
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: positions, ConfigNames: []string{"min.insync.replicas"}})
	if err != nil || len(entries) != 1 || entries[0].Value != "2" {
		t.Errorf("positions topic %s: min.insync.replicas %v (%v), want 2", positions, entries, err)
	}

	// A positions topic with one replica on this cluster of three is refused, by the
	// default relay.positions_min_replicas of 3. The relay publishes nothing and says why.
	rf1 := clusterTopic(t, k, "relay-positions-rf1", 1, 1)
	caught := &refusalLogger{t: t}
	r2, err := outbox.NewExactlyOnceRelay(d.DB, k, eosConfig(t, k, outbox.RelayConfig{Shard: "rf1", PositionsTopic: rf1,
		RetryBackoff: 200 * time.Millisecond}), caught)
	if err != nil {
		t.Fatalf("NewExactlyOnceRelay: %v", err)
	}
	t.Cleanup(func() { _ = r2.Close() })
	stop2 := runRelay(t, r2)
	waitFor(t, 60*time.Second, "the relay to refuse the positions topic with one replica", caught.refused)
	stop2()
	if r2.Published() != 0 {
		t.Errorf("the relay published %d events with a positions topic of one replica", r2.Published())
	}
}

// refusalLogger records whether the relay logged ErrPositionsReplication.
type refusalLogger struct {
	t   testing.TB
	hit atomic.Bool
}

func (l *refusalLogger) Error(msg string, err error, fields watermill.LogFields) {
	if errors.Is(err, outbox.ErrPositionsReplication) {
		if !l.hit.Swap(true) {
			l.t.Logf("relay refused: %s: %v", msg, err)
		}
	}
}
func (l *refusalLogger) Info(string, watermill.LogFields)                 {}
func (l *refusalLogger) Debug(string, watermill.LogFields)                {}
func (l *refusalLogger) Trace(string, watermill.LogFields)                {}
func (l *refusalLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }
func (l *refusalLogger) refused() bool                                    { return l.hit.Load() }

func clusterAdmin(t *testing.T, k kafkax.Config) sarama.ClusterAdmin {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatalf("cluster admin: %v", err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	return admin
}

// clusterTopic creates a topic with rf replicas and min.insync.replicas rf-1, at least 1.
func clusterTopic(t *testing.T, k kafkax.Config, prefix string, partitions int32, rf int16) string {
	t.Helper()
	name := prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	isr := strconv.Itoa(max(1, int(rf)-1))
	err := clusterAdmin(t, k).CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: rf,
		ConfigEntries: map[string]*string{"min.insync.replicas": &isr}}, false)
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	return name
}

// topLeaderOf is the broker leading most partitions of topic.
func topLeaderOf(t *testing.T, k kafkax.Config, topic string) int32 {
	t.Helper()
	md, err := clusterAdmin(t, k).DescribeTopics([]string{topic})
	if err != nil || len(md) != 1 {
		t.Fatalf("describe %s: %v", topic, err)
	}
	led := map[int32]int{}
	best := int32(-1)
	for _, p := range md[0].Partitions {
		led[p.Leader]++
		if p.Leader >= 0 && (best < 0 || led[p.Leader] > led[best]) {
			best = p.Leader
		}
	}
	if best < 0 {
		t.Fatalf("%s has no leader: %v", topic, md[0].Partitions)
	}
	return best
}

// coordinatorOf is the transaction coordinator of txn, found by FindCoordinator of type
// transaction.
func coordinatorOf(t *testing.T, k kafkax.Config, txn string) int32 {
	t.Helper()
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer client.Close()
	b, err := client.TransactionCoordinator(txn)
	if err != nil {
		t.Fatalf("coordinator of %s: %v", txn, err)
	}
	return b.ID()
}

package outbox

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// ErrPositionsReplication is wrapped by the error the relay returns when the positions topic
// has fewer replicas than RelayConfig.PositionsMinReplicas asks of a cluster of its size. The
// relay then refuses to publish. A positions topic on one broker loses what the relay
// reconciles against when that broker's disk fails.
var ErrPositionsReplication = errors.New("outbox relay: the positions topic has too few replicas for the cluster")

// positionsReplicas is the replication factor a positions topic must have on a cluster of
// brokers brokers when minReplicas are asked for, and the one the relay creates it with.
func positionsReplicas(minReplicas, brokers int) (need, create int) {
	need = min(minReplicas, brokers)
	create = max(min(3, brokers), need)
	return need, create
}

// ensurePositionsTopic creates the positions topic if it is missing, compacted and with one
// partition. It refuses an existing one with fewer replicas than PositionsMinReplicas asks
// of the cluster.
func (e *eosShard) ensurePositionsTopic() error {
	sc := e.saramaConfig(e.kc.ConsumerConfig())
	admin, err := sarama.NewClusterAdmin(e.kc.Brokers, sc)
	if err != nil {
		return kafkax.Unreachable(e.kc.Brokers, err)
	}
	defer admin.Close()
	topic := e.r.cfg.PositionsTopic
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return fmt.Errorf("describe kafka cluster: %w", err)
	}
	need, create := positionsReplicas(e.r.cfg.PositionsMinReplicas, len(brokers))
	md, err := admin.DescribeTopics([]string{topic})
	if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError {
		rf := 0
		for _, p := range md[0].Partitions {
			if rf == 0 || len(p.Replicas) < rf {
				rf = len(p.Replicas)
			}
		}
		if rf < need {
			return fmt.Errorf("%w: %s has replication factor %d on a cluster of %d brokers, relay.positions_min_replicas %d asks for %d "+
				"(add replicas with kafka-reassign-partitions, or set relay.positions_min_replicas: %d to accept it)",
				ErrPositionsReplication, topic, rf, len(brokers), e.r.cfg.PositionsMinReplicas, need, rf)
		}
		return nil
	}
	// Segments roll hourly instead of Kafka's default of 7 days. Compaction never touches
	// the active segment, so hourly segments keep the topic near one record per key. A
	// relay whose transactional id has no batch yet reads the whole partition back at
	// session start.
	policy, hour := "compact", "3600000"
	cfg := map[string]*string{"cleanup.policy": &policy, "min.compaction.lag.ms": &hour, "segment.ms": &hour}
	if create >= 3 {
		isr := strconv.Itoa(2)
		cfg["min.insync.replicas"] = &isr
	}
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: int16(create), ConfigEntries: cfg}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create relay positions topic %s: %w", topic, err)
	}
	e.r.logger.Info("outbox relay: created positions topic", watermill.LogFields{"topic": topic, "replication_factor": create})
	return nil
}

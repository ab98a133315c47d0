package outbox

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// ensurePositionsTopic creates the positions topic (compacted, one partition) if missing.
func (e *eosShard) ensurePositionsTopic() error {
	sc := e.saramaConfig(e.kc.ConsumerConfig())
	admin, err := sarama.NewClusterAdmin(e.kc.Brokers, sc)
	if err != nil {
		return kafkax.Unreachable(e.kc.Brokers, err)
	}
	defer admin.Close()
	topic := e.r.cfg.PositionsTopic
	md, err := admin.DescribeTopics([]string{topic})
	if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError {
		return nil
	}
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return fmt.Errorf("describe kafka cluster: %w", err)
	}
	// Segments roll hourly (Kafka's default is 7 days) so compaction, which never touches
	// the active segment, keeps the topic near one record per key: a relay whose
	// transactional id has no batch yet reads the whole partition back at session start.
	policy, hour := "compact", "3600000"
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: int16(min(3, len(brokers))),
		ConfigEntries: map[string]*string{"cleanup.policy": &policy, "min.compaction.lag.ms": &hour, "segment.ms": &hour}}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create relay positions topic %s: %w", topic, err)
	}
	e.r.logger.Info("outbox relay: created positions topic", watermill.LogFields{"topic": topic})
	return nil
}

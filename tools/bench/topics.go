package main

import (
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// makeTopic creates a topic of parts partitions named prefix-<time>, once every partition
// has a leader; the returned func deletes it.
func makeTopic(kc kafkax.Config, prefix string, parts int32) (string, func(), error) {
	return makeTopicWith(kc, prefix, parts, nil)
}

// makeTopicWith is makeTopic with topic settings (e.g. max.message.bytes).
func makeTopicWith(kc kafkax.Config, prefix string, parts int32, settings map[string]*string) (string, func(), error) {
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	admin, err := sarama.NewClusterAdmin(kc.Brokers, sc)
	if err != nil {
		return "", nil, kafkax.Unreachable(kc.Brokers, err)
	}
	name := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: parts, ReplicationFactor: 1, ConfigEntries: settings}, false); err != nil {
		admin.Close()
		return "", nil, err
	}
	if err := waitLeaders(kc, name, parts); err != nil {
		_ = admin.DeleteTopic(name)
		admin.Close()
		return "", nil, err
	}
	return name, func() { _ = admin.DeleteTopic(name); admin.Close() }, nil
}

// waitLeaders waits until every partition of a new topic has a leader in the metadata: the
// topic is listed (with all its partitions) before that, and a produce or offset request
// sent then fails with NOT_LEADER_OR_FOLLOWER (seen in runs that start with a rate, when
// nothing ran on the topic before).
func waitLeaders(kc kafkax.Config, topic string, parts int32) error {
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	client, err := sarama.NewClient(kc.Brokers, sc)
	if err != nil {
		return kafkax.Unreachable(kc.Brokers, err)
	}
	defer client.Close()
	var last error
	for range 100 {
		last = client.RefreshMetadata(topic)
		for p := int32(0); last == nil && p < parts; p++ {
			if _, last = client.Leader(topic, p); last == nil {
				_, last = client.GetOffset(topic, p, sarama.OffsetNewest)
			}
		}
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("topic %s: partitions without a leader after 10 s: %w", topic, last)
}

// positionsTopic names a positions topic of the bench's own (the relay creates it, compacted)
// and returns a func that deletes it, to call once the relay is closed. Each relay of the
// bench starts with a fresh transactional id, and a relay with a new id reads its positions
// partition from the oldest record (no earlier batch of its own to stop at): on the shared
// topic, which every bench run added ≈25,000 records to, that start grew from ≈1.2 to ≈4 s
// over a morning of runs, and took CPU from the measurement.
func positionsTopic(kc kafkax.Config) (string, func()) {
	name := fmt.Sprintf("bench-positions-%d", time.Now().UnixNano())
	return name, func() {
		sc := sarama.NewConfig()
		sc.Version = kafkax.Version
		if admin, err := sarama.NewClusterAdmin(kc.Brokers, sc); err == nil {
			_ = admin.DeleteTopic(name)
			admin.Close()
		}
	}
}

package kafkax

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// TopicState is what EnsureTopics found or did for one topic.
type TopicState struct {
	Topic             string
	Created           bool // missing, and created (or, in a dry run, would be)
	Partitions        int  // the topic's, or those it was created with
	ReplicationFactor int  // the topic's (its least replicated partition), or the one it was created with
}

// ErrReplication is returned by EnsureTopics for a replication factor the cluster cannot
// give, because it is more than the cluster's brokers.
var ErrReplication = errors.New("kafka: replication factor above the cluster's brokers")

// EnsureTopics creates those of topics that the cluster does not have, with partitions
// partitions and replication replicas. A replication of 0 stands for min(3, the cluster's
// brokers). EnsureTopics leaves existing topics as they are, whatever their partitions, and
// returns what it found for them. dryRun creates nothing. A topic that someone else created
// meanwhile counts as existing.
func (c Config) EnsureTopics(topics []string, partitions int32, replication int16, dryRun bool) ([]TopicState, error) {
	for _, t := range topics {
		if err := CheckTopicName(t); err != nil {
			return nil, err
		}
	}
	if partitions < 1 {
		return nil, fmt.Errorf("kafka: %d partitions: want at least 1", partitions)
	}
	admin, err := sarama.NewClusterAdmin(c.Brokers, c.base())
	if err != nil {
		return nil, Unreachable(c.Brokers, err)
	}
	defer admin.Close()
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return nil, Unreachable(c.Brokers, err)
	}
	switch {
	case replication == 0:
		replication = int16(min(3, len(brokers)))
	case replication < 0 || int(replication) > len(brokers):
		return nil, fmt.Errorf("%w: replication factor %d on a cluster of %d brokers", ErrReplication, replication, len(brokers))
	}
	existing, err := describe(admin, topics)
	if err != nil {
		return nil, err
	}
	var out []TopicState
	for _, t := range topics {
		if s, ok := existing[t]; ok {
			out = append(out, s)
			continue
		}
		s := TopicState{Topic: t, Created: true, Partitions: int(partitions), ReplicationFactor: int(replication)}
		if !dryRun {
			err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: replication}, false)
			if errors.Is(err, sarama.ErrTopicAlreadyExists) {
				again, derr := describe(admin, []string{t})
				if derr != nil {
					return out, derr
				}
				s = again[t]
			} else if err != nil {
				return out, fmt.Errorf("create kafka topic %s: %w", t, err)
			}
		}
		out = append(out, s)
	}
	if dryRun {
		return out, nil
	}
	// Wait until every created topic's partitions are in the metadata, so a router started
	// next finds them.
	var created []string
	for _, s := range out {
		if s.Created {
			created = append(created, s.Topic)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(created) > 0 {
		parts, err := c.CheckTopics(created...)
		if err == nil && !slices.ContainsFunc(created, func(t string) bool { return parts[t] < int(partitions) }) {
			break
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("kafka topics %s created, but not all in the metadata after 30s", strings.Join(created, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out, nil
}

// describe returns the topics of names the cluster has.
func describe(admin sarama.ClusterAdmin, names []string) (map[string]TopicState, error) {
	md, err := admin.DescribeTopics(names)
	if err != nil {
		return nil, fmt.Errorf("describe kafka topics: %w", err)
	}
	out := map[string]TopicState{}
	for _, m := range md {
		switch {
		case errors.Is(m.Err, sarama.ErrUnknownTopicOrPartition):
			continue
		case m.Err != sarama.ErrNoError:
			return nil, fmt.Errorf("describe kafka topic %s: %w", m.Name, m.Err)
		}
		rf := 0
		for _, p := range m.Partitions {
			if rf == 0 || len(p.Replicas) < rf {
				rf = len(p.Replicas)
			}
		}
		out[m.Name] = TopicState{Topic: m.Name, Partitions: len(m.Partitions), ReplicationFactor: rf}
	}
	return out, nil
}

package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// GroupTopic is a consumer group of the run and a topic it consumes.
type GroupTopic struct{ Group, Topic string }

// PartitionLag is how far a group's committed offset is behind the end of one partition.
type PartitionLag struct {
	Group, Topic string
	Partition    int32
	Committed    int64 // -1: nothing committed
	End          int64
	Lag          int64
}

func (l PartitionLag) String() string {
	return fmt.Sprintf("%s %s/%d committed %d end %d lag %d", l.Group, l.Topic, l.Partition, l.Committed, l.End, l.Lag)
}

// committedLag reads, for every group and every partition of its topic, the committed offset
// and the partition's end (high-water mark). A partition where the group committed nothing
// counts from start (the end recorded before the run; the oldest offset without it).
func committedLag(brokers []string, groups []GroupTopic, start map[string]map[int32]int64) ([]PartitionLag, error) {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return nil, fmt.Errorf("checker: kafka %v: %w", brokers, err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("checker: %w", err)
	}
	// Not admin.Close: it would close the client, which the deferred Close does.
	var out []PartitionLag
	for _, g := range groups {
		parts, err := client.Partitions(g.Topic)
		if err != nil {
			return nil, fmt.Errorf("checker: partitions of %s: %w", g.Topic, err)
		}
		offs, err := admin.ListConsumerGroupOffsets(g.Group, map[string][]int32{g.Topic: parts})
		if err != nil {
			return nil, fmt.Errorf("checker: offsets of group %s: %w", g.Group, err)
		}
		for _, p := range parts {
			end, err := client.GetOffset(g.Topic, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("checker: end of %s/%d: %w", g.Topic, p, err)
			}
			l := PartitionLag{Group: g.Group, Topic: g.Topic, Partition: p, Committed: -1, End: end}
			from, ok := start[g.Topic][p]
			if !ok {
				if from, err = client.GetOffset(g.Topic, p, sarama.OffsetOldest); err != nil {
					return nil, fmt.Errorf("checker: start of %s/%d: %w", g.Topic, p, err)
				}
			}
			if b := offs.GetBlock(g.Topic, p); b != nil && b.Offset >= 0 {
				l.Committed, from = b.Offset, b.Offset
			}
			l.Lag = max(end-from, 0)
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Partition < b.Partition
	})
	return out, nil
}

// waitLag polls committedLag until every partition's lag is 0 or wait has passed (offsets
// are committed asynchronously, every second), and returns the last reading.
func waitLag(ctx context.Context, brokers []string, groups []GroupTopic, start map[string]map[int32]int64, wait time.Duration) ([]PartitionLag, error) {
	deadline := time.Now().Add(wait)
	for {
		lags, err := committedLag(brokers, groups, start)
		if err == nil && totalLag(lags) == 0 {
			return lags, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return lags, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func totalLag(lags []PartitionLag) int64 {
	var n int64
	for _, l := range lags {
		n += l.Lag
	}
	return n
}

// lagSummary is "group topic: lag N on P partitions" per group and topic.
func lagSummary(lags []PartitionLag) string {
	type gt struct{ g, t string }
	sum, parts := map[gt]int64{}, map[gt]int{}
	var order []gt
	for _, l := range lags {
		k := gt{l.Group, l.Topic}
		if _, ok := parts[k]; !ok {
			order = append(order, k)
		}
		sum[k] += l.Lag
		parts[k]++
	}
	var s []string
	for _, k := range order {
		s = append(s, fmt.Sprintf("%s on %s: lag %d over %d partitions", k.g, k.t, sum[k], parts[k]))
	}
	return strings.Join(s, "; ")
}

// commitOffsets commits offsets (partition → offset) of topic for group, which must have no
// active member, and reads them back.
func commitOffsets(brokers []string, group, topic string, offsets map[int32]int64) error {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return err
	}
	defer client.Close()
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	if err != nil {
		return err
	}
	var poms []sarama.PartitionOffsetManager
	for p, off := range offsets {
		pom, err := om.ManagePartition(topic, p)
		if err != nil {
			om.Close()
			return fmt.Errorf("group %s %s/%d: %w", group, topic, p, err)
		}
		pom.MarkOffset(off, "")  // moves the offset forward only,
		pom.ResetOffset(off, "") // this one back only (or marks it dirty if equal)
		poms = append(poms, pom)
	}
	// Closed first, so that the commit also releases them (pom.Close would wait for the
	// auto-commit ticker to do that); the read-back below is what tells success.
	for _, pom := range poms {
		pom.AsyncClose()
	}
	om.Commit()
	if err := om.Close(); err != nil {
		return err
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return err
	}
	parts := make([]int32, 0, len(offsets))
	for p := range offsets {
		parts = append(parts, p)
	}
	got, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
	if err != nil {
		return err
	}
	for p, off := range offsets {
		if b := got.GetBlock(topic, p); b == nil || b.Offset != off {
			return fmt.Errorf("group %s %s/%d: committed %v after committing %d", group, topic, p, b, off)
		}
	}
	return nil
}

package kafkax

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// LagReader measures a consumer group's lag in records that a read_committed consumer would
// still be given. The offsets of a partition past the committed one may hold only
// transaction markers or aborted records. A commit marker takes an offset after every
// transaction. Such a partition has lag 0, not the 1 or more that the offsets say.
type LagReader struct {
	client sarama.Client

	mu     sync.Mutex
	proven map[topicPartition]lagSpan // the latest span read per partition and its answer
}

type topicPartition struct {
	topic     string
	partition int32
}

type lagSpan struct {
	from, to int64
	data     bool // the span holds a data record
}

// lagFetchBytes bounds one fetch of a lag check. lagFetches bounds the fetches of one
// check. A span of aborted records larger than these allow reads as lagging.
const (
	lagFetchBytes = 256 << 10
	lagFetches    = 8
)

// NewLagReader connects a client for lag checks. Close it.
func (c Config) NewLagReader() (*LagReader, error) {
	sc := c.base()
	sc.Net.ReadTimeout = 5 * time.Second
	sc.Net.WriteTimeout = 5 * time.Second
	client, err := sarama.NewClient(c.Brokers, sc)
	if err != nil {
		return nil, Unreachable(c.Brokers, err)
	}
	return &LagReader{client: client, proven: map[topicPartition]lagSpan{}}, nil
}

// Close closes the client.
func (l *LagReader) Close() error { return l.client.Close() }

// Lag returns end - committed. It returns 0 when a read_committed fetch from committed
// finds no data record before end, only transaction markers or aborted records. A span
// that Lag cannot judge counts whole. A transaction may still be open in it, or retention
// may have removed the offset.
func (l *LagReader) Lag(topic string, partition int32, committed, end int64) (int64, error) {
	if committed < 0 || end <= committed {
		return max(end-committed, 0), nil
	}
	k := topicPartition{topic, partition}
	l.mu.Lock()
	s, ok := l.proven[k]
	l.mu.Unlock()
	if !ok || s.from != committed || s.to != end {
		data, err := l.holdsData(topic, partition, committed, end)
		if err != nil {
			return end - committed, err
		}
		s = lagSpan{from: committed, to: end, data: data}
		l.mu.Lock()
		l.proven[k] = s
		l.mu.Unlock()
	}
	if !s.data {
		return 0, nil
	}
	return end - committed, nil
}

// errUndecided says that the span could not be judged. It is taken as holding data.
var errUndecided = errors.New("lag: span not judged")

// holdsData reports whether [from, to) of the partition holds a record a read_committed
// consumer is given. Undecided spans report true.
func (l *LagReader) holdsData(topic string, partition int32, from, to int64) (bool, error) {
	broker, err := l.client.Leader(topic, partition)
	if err != nil {
		return true, fmt.Errorf("lag of %s/%d: %w", topic, partition, err)
	}
	off := from
	for range lagFetches {
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 0, MinBytes: 1, MaxBytes: lagFetchBytes,
			Isolation: sarama.ReadCommitted, SessionID: 0, SessionEpoch: -1}
		req.AddBlock(topic, partition, off, lagFetchBytes, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			_ = l.client.RefreshMetadata(topic)
			return true, fmt.Errorf("lag of %s/%d: %w", topic, partition, err)
		}
		b := resp.GetBlock(topic, partition)
		if b == nil {
			return true, fmt.Errorf("lag of %s/%d: %w", topic, partition, errUndecided)
		}
		if !errors.Is(b.Err, sarama.ErrNoError) {
			return true, fmt.Errorf("lag of %s/%d: %w", topic, partition, b.Err)
		}
		data, next, err := scanBatches(b, off)
		if err != nil || data {
			return true, err
		}
		if next >= to {
			return false, nil
		}
		if next <= off || b.LastStableOffset <= next {
			// Nothing is past off yet, because a transaction still open holds the rest.
			return true, nil
		}
		off = next
	}
	return true, nil
}

// scanBatches reads a read_committed fetch from offset from. It reports whether the fetch
// holds a data record at or past from, one that is neither a control record nor in an
// aborted transaction. It also returns the offset after the fetch's last whole batch.
func scanBatches(b *sarama.FetchResponseBlock, from int64) (data bool, next int64, err error) {
	next = from
	aborted := b.AbortedTransactions
	abortedPIDs := map[int64]bool{}
	for _, rs := range b.RecordsSet {
		if rs.RecordBatch == nil {
			if rs.MsgSet != nil && len(rs.MsgSet.Messages) > 0 {
				return true, next, nil // the legacy format has no transactions
			}
			continue
		}
		rb := rs.RecordBatch
		if rb.PartialTrailingRecord {
			break
		}
		last := rb.FirstOffset + int64(rb.LastOffsetDelta)
		for len(aborted) > 0 && aborted[0].FirstOffset <= last {
			abortedPIDs[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		switch {
		case rb.Control:
			if len(rb.Records) > 0 && isAbortMarker(rb.Records[0].Key) {
				delete(abortedPIDs, rb.ProducerID)
			}
		case rb.IsTransactional && abortedPIDs[rb.ProducerID]:
		default:
			for _, r := range rb.Records {
				if rb.FirstOffset+r.OffsetDelta >= from {
					return true, next, nil
				}
			}
		}
		next = max(next, last+1)
	}
	return false, next, nil
}

// isAbortMarker reads a control record's key, an int16 version then an int16 type. Type 0
// aborts.
func isAbortMarker(key []byte) bool {
	return len(key) >= 4 && binary.BigEndian.Uint16(key[2:4]) == 0
}

// PartitionLag is a consumer group's position on one partition.
type PartitionLag struct {
	Topic     string
	Partition int32
	// Committed is the group's committed offset, or -1 when it has committed none.
	Committed int64
	// End is the partition's end offset, its high-water mark.
	End int64
	// Lag is End - Committed. It is 0 when only transaction markers or aborted records lie
	// between them. When the group has committed nothing, it counts from the partition's
	// start.
	Lag int64
}

// GroupLag reads group's committed offsets on every partition of topics, each partition's
// end, and the lag between them that Lag computes.
func (l *LagReader) GroupLag(group string, topics []string) ([]PartitionLag, error) {
	want := map[string][]int32{}
	for _, t := range topics {
		parts, err := l.client.Partitions(t)
		if err != nil {
			return nil, fmt.Errorf("kafka topic %q: %w", t, err)
		}
		want[t] = parts
	}
	admin, err := sarama.NewClusterAdminFromClient(l.client)
	if err != nil {
		return nil, err
	}
	// It is not closed, because closing it would close the shared client.
	offs, err := admin.ListConsumerGroupOffsets(group, want)
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	var out []PartitionLag
	for _, t := range topics {
		for _, p := range want[t] {
			pl := PartitionLag{Topic: t, Partition: p, Committed: -1}
			if pl.End, err = l.client.GetOffset(t, p, sarama.OffsetNewest); err != nil {
				return out, fmt.Errorf("end of %s/%d: %w", t, p, err)
			}
			from := int64(0)
			if b := offs.GetBlock(t, p); b != nil && b.Offset >= 0 {
				pl.Committed, from = b.Offset, b.Offset
			} else if from, err = l.client.GetOffset(t, p, sarama.OffsetOldest); err != nil {
				return out, fmt.Errorf("start of %s/%d: %w", t, p, err)
			}
			pl.Lag, _ = l.Lag(t, p, from, pl.End) // unjudged: the whole span
			out = append(out, pl)
		}
	}
	return out, nil
}

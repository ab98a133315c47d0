package outbox

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
)

// Metadata is the part of a Kafka client such as sarama.Client that the relay asks before
// it sends a batch. The relay asks it whether each topic exists.
type Metadata interface {
	Partitions(topic string) ([]int32, error)
	RefreshMetadata(topics ...string) error
}

// outRow is an outbox row on its way to Kafka.
type outRow struct {
	id      int64
	eventID string
	topic   string
	key     string
	msg     *sarama.ProducerMessage
	trace   sql.NullString // trace_parent, the writer's traceparent, NULL when it was not traced
}

func (o outRow) String() string {
	return fmt.Sprintf("event %s (topic %s, key %q, outbox id %d)", o.eventID, o.topic, o.key, o.id)
}

// refusal is why Kafka refuses a row for good.
type refusal struct {
	reason string
	err    error
}

func (f refusal) text(o outRow) string {
	return fmt.Sprintf("kafka refuses event %s for topic %s (key %q): %v", o.eventID, o.topic, o.key, f.err)
}

// checker checks the rows of one batch before they are sent.
type checker struct {
	md       Metadata // topics are not checked when nil
	maxBytes int      // sizes are not checked when 0
	topics   map[string]*refusal
}

// check returns the refusal a row would meet, or nil when the row can be sent. It returns
// an error when Kafka could not be asked. The batch then fails and is retried.
func (c *checker) check(o outRow) (*refusal, error) {
	if c.maxBytes > 0 {
		if size := o.msg.ByteSize(2); size > c.maxBytes {
			return &refusal{ReasonTooLarge, fmt.Errorf("record of %d bytes is larger than the producer's Producer.MaxMessageBytes (%d): %w",
				size, c.maxBytes, sarama.ErrMessageSizeTooLarge)}, nil
		}
	}
	if c.md == nil {
		return nil, nil
	}
	if f, ok := c.topics[o.topic]; ok {
		return f, nil
	}
	f, err := topicRefusal(c.md, o.topic)
	if err != nil {
		return nil, err
	}
	if c.topics == nil {
		c.topics = map[string]*refusal{}
	}
	c.topics[o.topic] = f
	return f, nil
}

// topicRefusal asks md about topic. A topic that is not in the metadata is asked for again
// with a forced refresh before it counts as missing. A topic created a moment ago may not
// have reached every broker's metadata yet.
func topicRefusal(md Metadata, topic string) (*refusal, error) {
	_, err := md.Partitions(topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		if err = md.RefreshMetadata(topic); err == nil {
			_, err = md.Partitions(topic)
		}
	}
	switch {
	case err == nil:
		return nil, nil
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
		return &refusal{ReasonUnknownTopic, fmt.Errorf("topic %s does not exist (after a metadata refresh): %w", topic, sarama.ErrUnknownTopicOrPartition)}, nil
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed):
		return &refusal{ReasonUnauthorized, fmt.Errorf("topic %s: %w", topic, sarama.ErrTopicAuthorizationFailed)}, nil
	case errors.Is(err, sarama.ErrInvalidTopic):
		return &refusal{ReasonInvalidRecord, fmt.Errorf("topic %s: %w", topic, sarama.ErrInvalidTopic)}, nil
	}
	return nil, fmt.Errorf("kafka metadata of topic %s: %w", topic, err)
}

// refusalReason reports whether a producer error means Kafka refuses the record for good.
// A missing topic is not among these errors. The next batch's check first confirms it
// against fresh metadata.
func refusalReason(err error) (string, bool) {
	switch {
	case errors.Is(err, sarama.ErrMessageSizeTooLarge), errors.Is(err, sarama.ErrMessageSetSizeTooLarge):
		return ReasonTooLarge, true
	case errors.Is(err, sarama.ErrInvalidRecord), errors.Is(err, sarama.ErrInvalidMessage), errors.Is(err, sarama.ErrInvalidTopic):
		return ReasonInvalidRecord, true
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed):
		return ReasonUnauthorized, true
	}
	// Sarama's own size check against Producer.MaxMessageBytes fails a record with a
	// ConfigurationError, not ErrMessageSizeTooLarge.
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) && strings.Contains(string(ce), "MaxMessageBytes") {
		return ReasonTooLarge, true
	}
	return "", false
}

// screening is a batch split by screen.
type screening struct {
	send []outRow    // to publish, in id order
	park []parkEntry // to move to the parked table
	kept int         // rows left in the outbox for a later batch
}

// screen goes through a batch in id order and sorts its rows.
//
//   - Rows of a key in skip stay in the outbox for a later batch.
//   - A row without a message stays too, with the later rows of its key. Another relay
//     holds its lock.
//   - Rows of a key with a parked event are held behind that event. heads maps a key to
//     its parked event's id. Events parked earlier in this batch count too.
//   - Rows that c says Kafka would refuse are parked with the refusal.
//   - The other rows are sent.
//
// send is rows' array, filtered in place. A row is copied only to an earlier index, once it
// was read. The caller no longer uses rows.
func screen(rows []outRow, heads map[string]string, skip map[string]bool, c *checker) (screening, error) {
	s := screening{send: rows[:0]}
	var fresh map[string]string // keys whose event was parked in this batch
	var busy map[string]bool    // keys with a row another relay holds
	for _, o := range rows {
		if o.msg == nil {
			if busy == nil {
				busy = map[string]bool{}
			}
			busy[o.key] = true
		}
		if skip[o.key] || busy[o.key] {
			s.kept++
			continue
		}
		if head, ok := fresh[o.key]; ok {
			s.park = append(s.park, parkEntry{row: o, reason: ReasonHeld, behind: head})
			continue
		}
		if head, ok := heads[o.key]; ok {
			s.park = append(s.park, parkEntry{row: o, reason: ReasonHeld, behind: head, existing: true})
			continue
		}
		f, err := c.check(o)
		if err != nil {
			return screening{}, fmt.Errorf("check %s: %w", o, err)
		}
		if f != nil {
			s.park = append(s.park, parkEntry{row: o, reason: f.reason, err: f.text(o)})
			if fresh == nil {
				fresh = map[string]string{}
			}
			fresh[o.key] = o.eventID
			continue
		}
		s.send = append(s.send, o)
	}
	return s, nil
}

// releasedKeys returns the keys parked before a pending read and no longer parked after it.
// before and after are the parked keys read at those times. The events of these keys were
// retried or dropped meanwhile. The read may have missed the events put back, so the rows
// of these keys wait for the next batch.
func releasedKeys(before, after map[string]string) map[string]bool {
	var out map[string]bool
	for k, head := range before {
		if after[k] != head {
			if out == nil {
				out = map[string]bool{}
			}
			out[k] = true
		}
	}
	return out
}

// isolation finds which rows of a batch Kafka refused when the errors alone do not tell.
// A broker rejects a whole partition's record batch. A transactional producer fails every
// record sent after the first failure with that same error. The rows that failed with a
// refusal become suspects. cut makes each of the next batches carry half of the suspects.
// This goes on until a batch of one row is refused, and that row is parked, or until the
// suspects went through. A refusal of exactly one row of a batch names that row at once.
type isolation struct {
	suspects map[int64]bool
}

// cut returns the part of send to publish now. Without suspects, that is all of send.
// Otherwise it is the rows before the first suspect. When a suspect comes first, it is the
// rows up to the middle suspect.
func (s *isolation) cut(send []outRow) []outRow {
	if len(s.suspects) == 0 {
		return send
	}
	n, first := 0, -1
	for i, o := range send {
		if s.suspects[o.id] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	switch {
	case n == 0:
		return send
	case first > 0:
		return send[:first]
	}
	k, seen := (n+1)/2, 0
	for i, o := range send {
		if s.suspects[o.id] {
			if seen++; seen == k {
				return send[:i+1]
			}
		}
	}
	return send
}

// outcome records the result of publishing batch. refused holds the indexes of the rows
// that failed with a refusal. outcome returns the indexes of the rows refused for sure.
func (s *isolation) outcome(batch []outRow, refused []int) []int {
	had := false
	for _, o := range batch {
		if s.suspects[o.id] {
			had = true
			delete(s.suspects, o.id)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	if len(refused) == 1 {
		return refused
	}
	if had {
		// The suspects of this batch contain the refused row, so the ones not sent are let
		// go. Should one of them be refused too, its batch makes it a suspect again.
		clear(s.suspects)
	}
	if s.suspects == nil {
		s.suspects = map[int64]bool{}
	}
	for _, i := range refused {
		s.suspects[batch[i].id] = true
	}
	return nil
}

// sendResult sorts the rows of a batch after a failed send.
type sendResult struct {
	refused   []int          // the batch indexes of the rows that failed with a refusal
	reasons   map[int]string // refused index → reason
	errs      map[int]error  // batch index → its error, refused or not
	failed    int            // rows that failed otherwise and are retried
	unknown   []string       // topics a row failed for as unknown, checked again with fresh metadata
	extraErr  error          // the error of extra, the position record, if any
	firstFail string         // the first failed row and its error, for the batch's error
}

// sortSend matches the errors of SendMessages to the rows of batch. extra is a record that
// is not a row, or nil. A row without an error was acked.
func sortSend(batch []outRow, extra *sarama.ProducerMessage, err error) sendResult {
	res := sendResult{reasons: map[int]string{}, errs: map[int]error{}}
	var pes sarama.ProducerErrors
	if !errors.As(err, &pes) {
		// The error is not tied to messages, so every row failed.
		for i := range batch {
			res.errs[i] = err
		}
		res.failed = len(batch)
		if len(batch) > 0 {
			res.firstFail = fmt.Sprintf("%s: %v", batch[0], err)
		}
		return res
	}
	index := make(map[*sarama.ProducerMessage]int, len(batch))
	for i, o := range batch {
		index[o.msg] = i
	}
	for _, pe := range pes {
		if pe.Msg == extra && extra != nil {
			res.extraErr = pe.Err
			continue
		}
		i, ok := index[pe.Msg]
		if !ok {
			continue
		}
		res.errs[i] = pe.Err
	}
	unknown := map[string]bool{}
	for i, o := range batch { // in id order
		e, ok := res.errs[i]
		if !ok {
			continue
		}
		if res.firstFail == "" {
			res.firstFail = fmt.Sprintf("%s: %v", o, e)
		}
		if reason, ok := refusalReason(e); ok {
			res.refused = append(res.refused, i)
			res.reasons[i] = reason
			continue
		}
		res.failed++
		if errors.Is(e, sarama.ErrUnknownTopicOrPartition) && !unknown[o.topic] {
			unknown[o.topic] = true
			res.unknown = append(res.unknown, o.topic)
		}
	}
	return res
}

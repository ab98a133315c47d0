package routercmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/jsonkeys"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// A produce file holds one Kafka record per line, as a JSON object.
// `router produce --file records.jsonl` sends such a file. Its lines look like these.
//
//	{"key": "o-1", "value": {"orderId": "o-1", "points": 40}, "headers": {"source": "test"}}
//	{"key": "o-2", "value": "plain text, sent without the quotes"}
//	{"key": "o-3", "value_base64": "/w=="}
//
// key is the record's key, and a record without it has no key. A JSON string as value is
// sent as its text. Any other JSON value is sent as the bytes written on the line,
// unchanged. value_base64 holds the value's bytes in standard base64, for bytes that are
// not UTF-8. A record with neither value nor value_base64 has no value and is a tombstone.
// headers holds string values. Field names are exact. A line is refused with its line
// number when it has any other field, a field name in another case such as "KEY", or a
// field or header given twice. So is a line that is not UTF-8 or not one JSON object, and a
// record larger than the topic takes. Then nothing is sent. Blank lines are skipped. A
// record gets a message id header, watermill's uuid, unless headers has one. The file is
// read once, into memory, so it may be a named pipe.

// fileLine is one line of a produce file.
type fileLine struct {
	Key         *string           `json:"key"`
	Value       json.RawMessage   `json:"value"`
	ValueBase64 *string           `json:"value_base64"`
	Headers     map[string]string `json:"headers"`
}

// maxFileLine is the longest line of a produce file. A record that Kafka takes is smaller.
const maxFileLine = 16 << 20

// parseFileLine reads one line of a produce file into a record.
func parseFileLine(line []byte) (record, error) {
	if err := inbox.CheckJSONText(line); err != nil {
		return record{}, fmt.Errorf("%w (bytes that are not UTF-8 go in value_base64)", err)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var l fileLine
	if err := dec.Decode(&l); err != nil {
		return record{}, fmt.Errorf("not a record: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return record{}, errors.New("data after the record's object")
	}
	// encoding/json took "KEY" for key and kept the last of a field given twice.
	if err := jsonkeys.Check(line, reflect.TypeOf(l)); err != nil {
		return record{}, fmt.Errorf("not a record: %w", err)
	}
	if l.Value != nil && l.ValueBase64 != nil {
		return record{}, errors.New("value and value_base64: give one")
	}
	var r record
	if l.Key != nil {
		r.key = []byte(*l.Key)
	}
	switch {
	case string(l.Value) == "null":
		return record{}, errors.New("value null: leave value out for a record without a value")
	case len(l.Value) > 0 && l.Value[0] == '"':
		var s string
		if err := json.Unmarshal(l.Value, &s); err != nil {
			return record{}, fmt.Errorf("value: %w", err)
		}
		r.value = []byte(s)
	case l.Value != nil:
		r.value = []byte(l.Value)
	case l.ValueBase64 != nil:
		b, err := base64.StdEncoding.Strict().DecodeString(*l.ValueBase64)
		if err != nil {
			return record{}, fmt.Errorf("value_base64: %w", err)
		}
		r.value = b
	}
	hasID := false
	for k, v := range l.Headers {
		r.headers = append(r.headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
		hasID = hasID || k == wkafka.UUIDHeaderKey
	}
	if !hasID {
		r.headers = append(r.headers, uuidHeader(watermill.NewUUID()))
	}
	return r, nil
}

// fileRecord is a record of a produce file and the number of its line.
type fileRecord struct {
	line int
	record
}

// message is the record as sent to topic.
func (r fileRecord) message(topic string) *sarama.ProducerMessage {
	pm := &sarama.ProducerMessage{Topic: topic, Headers: r.headers, Metadata: r.line}
	if r.key != nil {
		pm.Key = sarama.ByteEncoder(r.key)
	}
	if r.value != nil {
		pm.Value = sarama.ByteEncoder(r.value)
	}
	return pm
}

// readProduceFile reads the file at path once, whole, and returns its records. It refuses a
// bad line, naming it. Reading once lets path be a named pipe. A second open of a pipe
// would wait for a writer that never comes. The end of ctx stops readProduceFile, also
// while it waits for a pipe's writer.
func readProduceFile(ctx context.Context, path string) ([]fileRecord, error) {
	f, err := openInput(ctx, path)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("produce --file %s: stopped while opening it, nothing was sent: %w", path, err)
		}
		return nil, badInput(fmt.Errorf("produce --file: %w", err))
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return nil, badInput(fmt.Errorf("produce --file %s: a directory, not a file of records", path))
	}
	// A pipe's read waits for data, and a deadline in the past ends it. A regular file's
	// reads do not wait, and they refuse deadlines.
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	var recs []fileRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxFileLine)
	for n := 1; sc.Scan(); n++ {
		if ctx.Err() != nil {
			break
		}
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		r, err := parseFileLine(line)
		if err != nil {
			return nil, badInput(fmt.Errorf("produce --file %s, line %d: %s", path, n, oneLine(err)))
		}
		recs = append(recs, fileRecord{n, r})
	}
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("produce --file %s: stopped while reading it, nothing was sent: %w", path, err)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, badInput(fmt.Errorf("produce --file %s: a line longer than %d bytes", path, maxFileLine))
		}
		return nil, fmt.Errorf("produce --file %s: %w", path, err)
	}
	return recs, nil
}

// openInput opens path for reading, or returns ctx's cause if ctx ends first. Opening a
// named pipe waits until a writer opens it, and the open itself cannot be interrupted. So
// the open runs in a goroutine, which closes the file should it open later.
func openInput(ctx context.Context, path string) (*os.File, error) {
	type opened struct {
		f   *os.File
		err error
	}
	done := make(chan opened, 1)
	go func() {
		f, err := os.Open(path)
		done <- opened{f, err}
	}()
	select {
	case o := <-done:
		return o.f, o.err
	case <-ctx.Done():
		go func() {
			if o := <-done; o.f != nil {
				_ = o.f.Close()
			}
		}()
		return nil, context.Cause(ctx)
	}
}

// recordBatchOverhead is the size of a Kafka record batch's header, which Kafka calls
// RECORD_BATCH_OVERHEAD. A topic's max.message.bytes bounds a batch. So a record alone in a
// batch may have that much less.
const recordBatchOverhead = 61

// recordLimit is the most bytes that a record sent to topic may take, and what sets that
// limit. Sarama counts the bytes with ProducerMessage.ByteSize, an upper bound of the
// record's framed size. The limit is the producer's Producer.MaxMessageBytes, or the
// topic's max.message.bytes less a batch's header when that is lower. A producer given the
// limit as its MaxMessageBytes fills no batch beyond what the topic takes. When the topic's
// setting cannot be read, the producer's limit stands, and the broker refuses what is over
// its own limit.
func (a *app) recordLimit(kc kafkax.Config, topic string, producerMax int) (int, string) {
	limit, why := producerMax, fmt.Sprintf("the producer's limit (Producer.MaxMessageBytes %d)", producerMax)
	topicMax, err := topicMaxMessageBytes(kc, topic)
	if err != nil {
		a.Logger().Error("produce --file: the topic's max.message.bytes is unknown: records are checked against the producer's limit only", err,
			watermill.LogFields{"topic": topic})
		return limit, why
	}
	if topicMax-recordBatchOverhead < limit {
		limit = topicMax - recordBatchOverhead
		why = fmt.Sprintf("topic %s's limit (max.message.bytes %d, less %d for the record batch's header)", topic, topicMax, recordBatchOverhead)
	}
	return limit, why
}

// topicMaxMessageBytes reads topic's max.message.bytes, the largest record batch its
// brokers take. It is the topic's own setting, else the brokers' message.max.bytes.
func topicMaxMessageBytes(kc kafkax.Config, topic string) (int, error) {
	admin, err := sarama.NewClusterAdmin(kc.Brokers, kc.SaramaConfig())
	if err != nil {
		return 0, kafkax.Unreachable(kc.Brokers, err)
	}
	defer admin.Close()
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"max.message.bytes"}})
	if err != nil {
		return 0, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	for _, e := range entries {
		if e.Name == "max.message.bytes" {
			n, err := strconv.Atoi(e.Value)
			if err != nil || n <= recordBatchOverhead {
				return 0, fmt.Errorf("topic %s: max.message.bytes %q is not a size", topic, e.Value)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("topic %s: max.message.bytes not reported", topic)
}

// produceFile sends the records of o.file to o.topic. Without o.topic it sends them to the
// first topic of --plugin, or of the only registered plugin. Nothing is sent before every
// line is read and checked, its size against the topic's limit too. A record that Kafka
// still refuses stops the run. The error names the record's line and how many records were
// sent.
func (a *app) produceFile(ctx context.Context, o produceOpts) error {
	recs, err := readProduceFile(ctx, o.file)
	if err != nil {
		return err
	}
	if o.topic == "" {
		if err := a.CheckSections(); err != nil {
			return err
		}
		var ps []onceflow.Plugin
		switch names := a.PluginNames(); {
		case o.plugin != "":
			ps, err = a.Plugins(o.plugin)
		case len(names) == 1:
			ps, err = a.Plugins(names[0])
		default:
			return badInput(fmt.Errorf("produce --file: name the topic (--topic) or the plugin whose first topic it is (--plugin; registered: %s)", strings.Join(names, ", ")))
		}
		if err != nil {
			return err
		}
		o.topic = ps[0].Topics[0]
	}
	kc := a.Kafka()
	if _, err := kc.CheckTopics(o.topic); err != nil {
		return err
	}
	pc := kc.ProducerConfig()
	limit, why := a.recordLimit(kc, o.topic, pc.Producer.MaxMessageBytes)
	for _, r := range recs {
		if size := r.message(o.topic).ByteSize(2); size > limit {
			return badInput(fmt.Errorf("produce --file %s, line %d: the record takes %d bytes, over the %d of %s; nothing was sent", o.file, r.line, size, limit, why))
		}
	}
	pc.Producer.MaxMessageBytes = limit
	producer, err := sarama.NewSyncProducer(kc.Brokers, pc)
	if err != nil {
		return kafkax.Unreachable(kc.Brokers, err)
	}
	defer producer.Close()
	start := time.Now()
	sent := 0
	var batch []*sarama.ProducerMessage
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := producer.SendMessages(batch)
		if err == nil {
			sent += len(batch)
			batch = batch[:0]
			return nil
		}
		var perrs sarama.ProducerErrors
		if !errors.As(err, &perrs) || len(perrs) == 0 {
			return fmt.Errorf("produce --file %s: lines %d to %d: %w; %d of %d records were sent before them, the rest not", o.file,
				batch[0].Metadata, batch[len(batch)-1].Metadata, err, sent, len(recs))
		}
		first := perrs[0]
		for _, pe := range perrs {
			if pe.Msg.Metadata.(int) < first.Msg.Metadata.(int) {
				first = pe
			}
		}
		sent += len(batch) - len(perrs)
		more := ""
		if len(perrs) > 1 {
			more = fmt.Sprintf(" (and %d more records of its request)", len(perrs)-1)
		}
		return fmt.Errorf("produce --file %s, line %d: kafka refused the record%s: %w; stopped there: %d of %d records were sent", o.file,
			first.Msg.Metadata, more, first.Err, sent, len(recs))
	}
	for i, r := range recs {
		if ctx.Err() != nil {
			break
		}
		batch = append(batch, r.message(o.topic))
		if len(batch) >= o.batch {
			if err := flush(); err != nil {
				return err
			}
		}
		if o.rate > 0 {
			if due := start.Add(time.Duration(float64(i+1) / o.rate * float64(time.Second))); time.Until(due) > 0 {
				if err := flush(); err != nil {
					return err
				}
				sleepCtx(ctx, time.Until(due))
			}
		}
	}
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("produce --file %s: stopped: %w; %d of %d records were sent", o.file, err, sent, len(recs))
	}
	if err := flush(); err != nil {
		return err
	}
	printf("PRODUCED records=%d topic=%s file=%s seconds=%.2f\n", sent, o.topic, o.file, time.Since(start).Seconds())
	return nil
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// oneLine is err's text on one line. It trims the lines of the text and joins them with a
// semicolon and a space.
func oneLine(err error) string {
	var parts []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

package onceflow

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/inbox"
)

// A produce file (`router produce --file records.jsonl`) holds one Kafka record per line, a
// JSON object:
//
//	{"key": "o-1", "value": {"orderId": "o-1", "points": 40}, "headers": {"source": "test"}}
//	{"key": "o-2", "value": "plain text, sent without the quotes"}
//	{"key": "o-3", "value_base64": "/w=="}
//
// key: the record's key (no key when left out). value: a JSON string is sent as its text,
// any other JSON value as the bytes written on the line, unchanged. value_base64: the value's
// bytes in standard base64, for bytes that are not UTF-8. Neither: a record without a value
// (a tombstone). headers: string values. Any other field, a line that is not UTF-8 or not one
// JSON object, is refused with its line number, and then nothing is sent. Blank lines are
// skipped. A record gets a message id header (watermill's uuid) unless headers has one.

// fileLine is one line of a produce file.
type fileLine struct {
	Key         *string           `json:"key"`
	Value       json.RawMessage   `json:"value"`
	ValueBase64 *string           `json:"value_base64"`
	Headers     map[string]string `json:"headers"`
}

// maxFileLine is the longest line of a produce file (a record Kafka takes is smaller).
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

// readProduceFile calls each with every record of the file at path, in order; a bad line
// stops it with an error naming the line.
func readProduceFile(path string, each func(record) error) error {
	f, err := os.Open(path)
	if err != nil {
		return badInput(fmt.Errorf("produce --file: %w", err))
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxFileLine)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		r, err := parseFileLine(line)
		if err != nil {
			return badInput(fmt.Errorf("produce --file %s, line %d: %s", path, n, oneLine(err)))
		}
		if err := each(r); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return badInput(fmt.Errorf("produce --file %s: a line longer than %d bytes", path, maxFileLine))
		}
		return fmt.Errorf("produce --file %s: %w", path, err)
	}
	return nil
}

// produceFile sends the records of o.file to o.topic (default: --plugin's first topic, or
// the only registered plugin's), after checking every line.
func (a *app) produceFile(o produceOpts) error {
	records := 0
	if err := readProduceFile(o.file, func(record) error { records++; return nil }); err != nil {
		return err
	}
	if o.topic == "" {
		if err := a.checkSections(); err != nil {
			return err
		}
		var p plugin
		switch names := a.plugins.Names(); {
		case o.plugin != "":
			q, ok, err := a.plugin(o.plugin)
			if err != nil {
				return err
			}
			if !ok {
				return badInput(fmt.Errorf("unknown plugin %q (registered: %v)", o.plugin, names))
			}
			p = q
		case len(names) == 1:
			q, _, err := a.plugin(names[0])
			if err != nil {
				return err
			}
			p = q
		default:
			return badInput(fmt.Errorf("produce --file: name the topic (--topic) or the plugin whose first topic it is (--plugin; registered: %s)", strings.Join(names, ", ")))
		}
		o.topic = p.Topics[0]
	}
	kc := a.kafka()
	if _, err := kc.CheckTopics(o.topic); err != nil {
		return err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	start := time.Now()
	var batch []*sarama.ProducerMessage
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := producer.SendMessages(batch); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		batch = batch[:0]
		return nil
	}
	sent := 0
	err = readProduceFile(o.file, func(r record) error {
		pm := &sarama.ProducerMessage{Topic: o.topic, Headers: r.headers}
		if r.key != nil {
			pm.Key = sarama.ByteEncoder(r.key)
		}
		if r.value != nil {
			pm.Value = sarama.ByteEncoder(r.value)
		}
		batch = append(batch, pm)
		sent++
		if len(batch) >= o.batch {
			if err := flush(); err != nil {
				return err
			}
		}
		if o.rate > 0 {
			if due := start.Add(time.Duration(float64(sent) / o.rate * float64(time.Second))); time.Until(due) > 0 {
				if err := flush(); err != nil {
					return err
				}
				time.Sleep(time.Until(due))
			}
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return err
	}
	printf("PRODUCED records=%d topic=%s file=%s seconds=%.2f\n", sent, o.topic, o.file, time.Since(start).Seconds())
	return nil
}

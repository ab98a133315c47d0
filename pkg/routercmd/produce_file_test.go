package routercmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestParseFileLine checks that a produce file's line is one record. A string value is its
// text. Any other JSON value is the line's bytes, unchanged. value_base64 holds bytes that
// are not UTF-8. Anything else is refused.
func TestParseFileLine(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		key, value string // a value of "<nil>" means none
		headers    int    // besides the message id
		err        string
	}{
		{name: "object", line: `{"key": "o-1", "value": {"orderId": "o-1",  "points": 40}}`, key: "o-1", value: `{"orderId": "o-1",  "points": 40}`},
		{name: "string", line: `{"key": "o-2", "value": "text \u00e9\n"}`, key: "o-2", value: "text é\n"},
		{name: "number", line: `{"value": 12.50}`, value: "12.50"},
		{name: "base64", line: `{"key": "k", "value_base64": "/w=="}`, key: "k", value: "\xff"},
		{name: "tombstone", line: `{"key": "k", "headers": {"a": "1", "b": "2"}}`, key: "k", value: "<nil>", headers: 2},
		{name: "not UTF-8", line: "{\"key\": \"k\", \"value\": \"\xff\"}", err: "not valid UTF-8"},
		{name: "lone surrogate", line: `{"key": "k", "value": "\ud800"}`, err: "surrogate"},
		{name: "unknown field", line: `{"key": "k", "vale": "x"}`, err: "unknown field"},
		{name: "both values", line: `{"value": "x", "value_base64": "eA=="}`, err: "give one"},
		{name: "null value", line: `{"value": null}`, err: "leave value out"},
		{name: "bad base64", line: `{"value_base64": "not base64"}`, err: "value_base64"},
		{name: "header not a string", line: `{"headers": {"a": 1}}`, err: "not a record"},
		{name: "two objects", line: `{"key": "a"} {"key": "b"}`, err: "data after"},
		{name: "not an object", line: `["k", "v"]`, err: "not a record"},
		{name: "field in another case", line: `{"KEY": "k", "value": 1}`, err: `not a record: field name in another case: "KEY" at byte 1 is field "key"`},
		{name: "field given twice", line: `{"key": "a", "value": 1, "key": "b"}`, err: `not a record: key given twice: "key" at byte 25`},
		{name: "header given twice", line: `{"key": "a", "headers": {"h": "1", "h": "2"}}`, err: `key given twice: "h" at byte 35`},
		{name: "a value's own keys are sent as written", line: `{"key": "k", "value": {"orderId": "a", "ORDERID": "b", "orderId": "c"}}`, key: "k",
			value: `{"orderId": "a", "ORDERID": "b", "orderId": "c"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseFileLine([]byte(tc.line))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			value := string(r.value)
			if r.value == nil {
				value = "<nil>"
			}
			if string(r.key) != tc.key || value != tc.value {
				t.Fatalf("key %q value %q, want %q %q", r.key, value, tc.key, tc.value)
			}
			if len(r.headers) != tc.headers+1 || string(r.headers[len(r.headers)-1].Key) != wkafka.UUIDHeaderKey {
				t.Fatalf("headers %v: want %d and a message id", r.headers, tc.headers)
			}
		})
	}
}

// TestProduceFile checks that `router produce --file` sends each line's record as written.
// A bad line stops it before anything is sent, and the error names the line.
func TestProduceFile(t *testing.T) {
	testenv.Integration(t)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "produce-file", 1)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl")
	body := `{"key": "o-1", "value": {"orderId": "o-1"}, "headers": {"source": "file"}}` + "\n\n" +
		`{"key": "o-2", "value_base64": "/w=="}` + "\n"
	bad := filepath.Join(dir, "bad.jsonl")
	for path, b := range map[string]string{good: body, bad: body + `{"key": "o-3", "valu": 1}` + "\n"} {
		if err := os.WriteFile(path, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	brokers := strings.Join(k.Brokers, ",")
	_, err := capture(t, "--brokers", brokers, "produce", "--file", bad, "--topic", topic)
	if ExitCode(err) != 2 || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), "valu") {
		t.Fatalf("bad file: %v, want exit 2 naming line 4", err)
	}
	if _, err := capture(t, "--brokers", brokers, "produce", "--file", good, "--orders", "5"); ExitCode(err) != 2 {
		t.Fatalf("--file with --orders: %v, want exit 2", err)
	}
	out, err := capture(t, "--brokers", brokers, "produce", "--file", good, "--topic", topic)
	if err != nil || !strings.Contains(out, "PRODUCED records=2 topic="+topic) {
		t.Fatalf("produce --file: %v\n%s", err, out)
	}
	recs, err := k.ReadAll(context.Background(), topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Key != "o-1" || string(recs[0].Value) != `{"orderId": "o-1"}` || recs[0].Headers["source"] != "file" ||
		recs[0].Headers[wkafka.UUIDHeaderKey] == "" || recs[1].Key != "o-2" || string(recs[1].Value) != "\xff" {
		t.Fatalf("records on the topic: %+v (the bad file's must not be there)", recs)
	}
}

// writeLines writes a produce file of lines and returns its path.
func writeLines(t *testing.T, name string, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readBack is every record on topic.
func readBack(t *testing.T, k kafkax.Config, topic string) []kafkax.Record {
	t.Helper()
	recs, err := k.ReadAll(context.Background(), topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// TestProduceFileSizeLimit checks that a file with one line over the topic's size limit in
// the middle is refused whole before anything is sent. The error names the line, and the
// exit code is 2. A file with a line over the producer's limit is refused too. Records that
// each fit the topic are sent in batches that fit it too. A producer that filled batches up
// to its own 1 MiB would have the broker refuse them.
func TestProduceFileSizeLimit(t *testing.T) {
	testenv.Integration(t)
	k := testenv.Kafka(t)
	brokers := strings.Join(k.Brokers, ",")
	small := testenv.TopicWithConfig(t, k, "produce-file-small", 1, map[string]string{"max.message.bytes": "20000"})
	var lines []string
	for i := 1; i <= 261; i++ {
		size := 100
		if i == 251 {
			size = 30_000
		}
		lines = append(lines, fmt.Sprintf(`{"key": "o-%d", "value": %q}`, i, strings.Repeat("v", size)))
	}
	_, err := capture(t, "--brokers", brokers, "produce", "--file", writeLines(t, "oversized.jsonl", lines), "--topic", small)
	if ExitCode(err) != 2 || !strings.Contains(err.Error(), "line 251: the record takes ") ||
		!strings.Contains(err.Error(), "max.message.bytes 20000") || !strings.Contains(err.Error(), "nothing was sent") {
		t.Fatalf("a line over the topic's limit: %v, want exit 2 naming line 251 and the limit", err)
	}
	if recs := readBack(t, k, small); len(recs) != 0 {
		t.Fatalf("%d records on the topic, want none", len(recs))
	}

	lines = lines[:0]
	for i := 1; i <= 10; i++ {
		lines = append(lines, fmt.Sprintf(`{"key": "f-%d", "value": %q}`, i, strings.Repeat("f", 8_000)))
	}
	out, err := capture(t, "--brokers", brokers, "produce", "--file", writeLines(t, "fits.jsonl", lines), "--topic", small)
	if err != nil || !strings.Contains(out, "PRODUCED records=10 ") {
		t.Fatalf("records that each fit the topic: %v\n%s", err, out)
	}
	if recs := readBack(t, k, small); len(recs) != 10 || recs[9].Key != "f-10" {
		t.Fatalf("%d records on the topic, want the 10 sent", len(recs))
	}

	plain := testenv.Topic(t, k, "produce-file-plain", 1)
	big := writeLines(t, "big.jsonl", []string{`{"key": "a", "value": 1}`, `{"key": "b", "value": "` + strings.Repeat("b", 1_100_000) + `"}`, `{"key": "c", "value": 3}`})
	if _, err := capture(t, "--brokers", brokers, "produce", "--file", big, "--topic", plain); ExitCode(err) != 2 || !strings.Contains(err.Error(), "line 2: the record takes ") {
		t.Fatalf("a line over the producer's limit: %v, want exit 2 naming line 2", err)
	}
	if recs := readBack(t, k, plain); len(recs) != 0 {
		t.Fatalf("%d records on the topic, want none", len(recs))
	}
}

// TestProduceFileBrokerRefusal checks that a record only the broker refuses stops the run
// there. A compacted topic takes no record without a key. The error names the record's line
// and how many records were sent, and no later line is sent.
func TestProduceFileBrokerRefusal(t *testing.T) {
	testenv.Integration(t)
	k := testenv.Kafka(t)
	topic := testenv.TopicWithConfig(t, k, "produce-file-compacted", 1, map[string]string{"cleanup.policy": "compact"})
	path := writeLines(t, "keyless.jsonl", []string{`{"key": "a", "value": 1}`, `{"key": "b", "value": 2}`, `{"key": "c", "value": 3}`,
		`{"value": 4}`, `{"key": "e", "value": 5}`, `{"key": "f", "value": 6}`})
	_, err := capture(t, "--brokers", strings.Join(k.Brokers, ","), "produce", "--file", path, "--topic", topic, "--batch", "1")
	if ExitCode(err) != 1 || !strings.Contains(err.Error(), "line 4: kafka refused the record") || !strings.Contains(err.Error(), "3 of 6 records were sent") {
		t.Fatalf("a record the broker refuses: %v, want exit 1 naming line 4 and 3 of 6 sent", err)
	}
	if recs := readBack(t, k, topic); len(recs) != 3 || recs[2].Key != "c" {
		t.Fatalf("records on the topic: %+v, want lines 1 to 3", recs)
	}
}

// runAsync runs the command line in the background. The channel gets its error.
func runAsync(ctx context.Context, args ...string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- Run(ctx, args) }()
	return done
}

// waitRun waits for a command started by runAsync. The bound is no timing assertion.
// Without it a command that never returns, which is the test's failure, would hang the
// package's tests.
func waitRun(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s has not returned", what)
		return nil
	}
}

// TestProduceFileNamedPipe checks that a named pipe given to --file is read once and its
// records are sent. A second open would wait for a writer that never comes. Ending the
// context ends the command, also while the pipe has no writer yet. Then nothing is sent.
func TestProduceFileNamedPipe(t *testing.T) {
	testenv.Integration(t)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "produce-file-fifo", 1)
	brokers := strings.Join(k.Brokers, ",")
	fifo := filepath.Join(t.TempDir(), "records.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	writer := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			writer <- err
			return
		}
		_, err = f.WriteString(`{"key": "p-1", "value": 1}` + "\n" + `{"key": "p-2", "value": 2}` + "\n")
		writer <- errors.Join(err, f.Close())
	}()
	if err := waitRun(t, runAsync(context.Background(), "--brokers", brokers, "produce", "--file", fifo, "--topic", topic), "produce --file of a named pipe"); err != nil {
		t.Fatalf("produce --file of a named pipe: %v", err)
	}
	if err := <-writer; err != nil {
		t.Fatal(err)
	}
	if recs := readBack(t, k, topic); len(recs) != 2 || recs[0].Key != "p-1" || recs[1].Key != "p-2" {
		t.Fatalf("records on the topic: %+v, want the pipe's two", recs)
	}

	// With no writer the command waits for one until its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	done := runAsync(ctx, "--brokers", brokers, "produce", "--file", fifo, "--topic", topic)
	cancel()
	err := waitRun(t, done, "produce --file of a pipe without a writer, cancelled")
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "nothing was sent") {
		t.Fatalf("cancelled while waiting for the pipe's writer: %v, want the cancellation and nothing sent", err)
	}
	// A writer that opens and closes the pipe releases the open still waiting, if any.
	if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		f.Close()
	}
	if recs := readBack(t, k, topic); len(recs) != 2 {
		t.Fatalf("%d records on the topic, want the first run's 2", len(recs))
	}
}

package onceflow

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/internal/testenv"
)

// A produce file's line is one record: a string value is its text, any other JSON value the
// line's bytes unchanged, value_base64 bytes that are not UTF-8; anything else is refused.
func TestParseFileLine(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		key, value string // value "<nil>": none
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

// `router produce --file` sends each line's record as written; a bad line stops it before
// anything is sent, naming the line.
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

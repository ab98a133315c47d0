package outbox

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/tracex"
)

// testRow is an outbox row's columns as the driver gives them, with nil for NULL.
type testRow struct {
	id                                                 int64
	eventID, typ, topic, key, payload, headers, traceP []byte
}

func (c testRow) raw() [8]sql.RawBytes {
	return [8]sql.RawBytes{[]byte(fmt.Sprint(c.id)), c.eventID, c.typ, c.topic, c.key, c.payload, c.headers, c.traceP}
}

// refMessage is the message a row gives when every column is scanned into strings and
// []byte and copied into the message one by one. rowReader must give the same message.
func refMessage(c testRow) (*sarama.ProducerMessage, error) {
	traced := len(c.traceP) > 0
	hs := []sarama.RecordHeader{{Key: []byte(HeaderEventID), Value: []byte(string(c.eventID))}, {Key: []byte(HeaderEventType), Value: []byte(string(c.typ))}}
	if traced {
		hs = append(hs, sarama.RecordHeader{Key: []byte(tracex.Header), Value: []byte(string(c.traceP))})
	}
	var value sarama.ByteEncoder
	if c.payload != nil {
		value = append([]byte{}, c.payload...)
	}
	m := &sarama.ProducerMessage{Topic: string(c.topic), Key: sarama.StringEncoder(c.key), Value: value, Headers: hs}
	if len(c.headers) > 0 {
		var extra map[string]string
		if err := json.Unmarshal(c.headers, &extra); err != nil {
			return nil, fmt.Errorf("outbox row %d headers: %w", c.id, err)
		}
		for k, v := range extra {
			if traced && k == tracex.Header {
				continue
			}
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
		}
	}
	return m, nil
}

// readRows reads cs as one batch, as pending does.
func readRows(rd *rowReader, cs []testRow) ([]outRow, error) {
	raws := make([][8]sql.RawBytes, len(cs))
	for i, c := range cs {
		raws[i] = c.raw()
	}
	return readRaw(rd, raws)
}

func readRaw(rd *rowReader, raws [][8]sql.RawBytes) ([]outRow, error) {
	b := rd.start()
	for _, raw := range raws {
		rd.raw = raw
		id, err := strconv.ParseInt(string(raw[0]), 10, 64)
		if err != nil {
			return nil, err
		}
		if err := rd.keep(b, id); err != nil {
			return nil, err
		}
	}
	return rd.rows(b), nil
}

// encoded is what Sarama writes of an Encoder. nil stays nil, for a null key or value.
func encoded(t *testing.T, e sarama.Encoder) []byte {
	t.Helper()
	if e == nil {
		return nil
	}
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func headerText(hs []sarama.RecordHeader) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = fmt.Sprintf("%q=%q(nil %v)", h.Key, h.Value, h.Value == nil)
	}
	return out
}

// TestRowReaderMessages checks that the messages rowReader makes are those of refMessage.
// Topic, key, value and headers match byte for byte, whatever the headers column holds. The
// extra headers of refMessage come from a map, in any order. Escapes, duplicate names,
// invalid UTF-8 and other JSON values go through encoding/json.
func TestRowReaderMessages(t *testing.T) {
	tp := []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	base := testRow{id: 7, eventID: []byte("e-7"), typ: []byte("T"), topic: []byte("orders"), key: []byte("k1"), payload: []byte{0xff, 0, 'x'}}
	with := func(f func(*testRow)) testRow { c := base; f(&c); return c }
	cases := []struct {
		name    string
		row     testRow
		extra   []string // the extra headers in order, when they must come in the object's order
		wantErr bool
	}{
		{name: "plain", row: base},
		{name: "empty payload and key", row: with(func(c *testRow) { c.payload, c.key = []byte{}, []byte{} })},
		{name: "null payload", row: with(func(c *testRow) { c.payload = nil })},
		{name: "traced", row: with(func(c *testRow) { c.traceP = tp })},
		{name: "empty trace parent", row: with(func(c *testRow) { c.traceP = []byte{} })},
		{name: "empty headers", row: with(func(c *testRow) { c.headers = []byte{} })},
		{name: "empty object", row: with(func(c *testRow) { c.headers = []byte(" { } ") })},
		{name: "headers in order", row: with(func(c *testRow) { c.headers = []byte(`{"z":"1","a":"","m":"é ü"}`) }),
			extra: []string{`"z"="1"`, `"a"=""`, `"m"="é ü"`}},
		{name: "spaces", row: with(func(c *testRow) { c.headers = []byte("\t{ \"a\" : \"1\" ,\n\"b\":\"2\"\r}\n") }),
			extra: []string{`"a"="1"`, `"b"="2"`}},
		{name: "traced replaces traceparent", row: with(func(c *testRow) {
			c.traceP, c.headers = tp, []byte(`{"traceparent":"00-other","x":"y"}`)
		}), extra: []string{`"x"="y"`}},
		{name: "untraced keeps traceparent", row: with(func(c *testRow) { c.headers = []byte(`{"traceparent":"00-other"}`) }),
			extra: []string{`"traceparent"="00-other"`}},
		{name: "escapes", row: with(func(c *testRow) { c.headers = []byte(`{"a\"b":"\u00e9\n\\","c":"\u003c"}`) })},
		{name: "duplicate names", row: with(func(c *testRow) { c.headers = []byte(`{"a":"1","b":"2","a":"3"}`) })},
		{name: "invalid utf-8", row: with(func(c *testRow) { c.headers = []byte("{\"a\":\"\xff\xfe\"}") })},
		{name: "null", row: with(func(c *testRow) { c.headers = []byte(`null`) })},
		{name: "not strings", row: with(func(c *testRow) { c.headers = []byte(`{"a":1}`) }), wantErr: true},
		{name: "control character", row: with(func(c *testRow) { c.headers = []byte("{\"a\":\"x\ty\"}") }), wantErr: true},
		{name: "truncated", row: with(func(c *testRow) { c.headers = []byte(`{"a":"1"`) }), wantErr: true},
		{name: "trailing", row: with(func(c *testRow) { c.headers = []byte(`{"a":"1"} x`) }), wantErr: true},
		{name: "not an object", row: with(func(c *testRow) { c.headers = []byte(`["a"]`) }), wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, werr := refMessage(tc.row)
			var rd rowReader
			rows, err := readRows(&rd, []testRow{tc.row})
			if (err != nil) != tc.wantErr || (werr != nil) != tc.wantErr {
				t.Fatalf("error %v (before: %v), want an error: %v", err, werr, tc.wantErr)
			}
			if tc.wantErr {
				if err.Error() != werr.Error() {
					t.Fatalf("error %q, was %q", err, werr)
				}
				return
			}
			o, got := rows[0], rows[0].msg
			if o.id != tc.row.id || o.eventID != string(tc.row.eventID) || o.topic != string(tc.row.topic) || o.key != string(tc.row.key) ||
				o.trace != (sql.NullString{String: string(tc.row.traceP), Valid: tc.row.traceP != nil}) {
				t.Errorf("row %d %q %q %q %v", o.id, o.eventID, o.topic, o.key, o.trace)
			}
			if got.Topic != want.Topic {
				t.Errorf("topic %q, want %q", got.Topic, want.Topic)
			}
			for _, p := range []struct {
				what      string
				got, want sarama.Encoder
			}{{"key", got.Key, want.Key}, {"value", got.Value, want.Value}} {
				g, w := encoded(t, p.got), encoded(t, p.want)
				if string(g) != string(w) || (g == nil) != (w == nil) {
					t.Errorf("%s %q (nil %v), want %q (nil %v)", p.what, g, g == nil, w, w == nil)
				}
			}
			gh, wh := headerText(got.Headers), headerText(want.Headers)
			fixed := 2
			if len(tc.row.traceP) > 0 {
				fixed = 3
			}
			if len(gh) < fixed || !slices.Equal(gh[:fixed], wh[:fixed]) {
				t.Fatalf("headers %v, want %v first", gh, wh[:fixed])
			}
			if tc.extra != nil {
				var ge []string
				for _, h := range got.Headers[fixed:] {
					ge = append(ge, fmt.Sprintf("%q=%q", h.Key, h.Value))
				}
				if !slices.Equal(ge, tc.extra) {
					t.Errorf("extra headers %v, want %v", ge, tc.extra)
				}
			}
			slices.Sort(gh[fixed:])
			slices.Sort(wh[fixed:])
			if !slices.Equal(gh, wh) {
				t.Errorf("headers %v, want %v", gh, wh)
			}
		})
	}
}

// TestRowReaderBatchesDoNotAlias checks that a batch's messages share its buffers but never
// each other's bytes. Every row keeps its own key, value and headers. A header appended to
// one message does not land in the next. The next batch's rows, read with the same reader,
// leave the first's as they were.
func TestRowReaderBatchesDoNotAlias(t *testing.T) {
	var rd rowReader
	batch := func(prefix string, n int) []testRow {
		var cs []testRow
		for i := range n {
			c := testRow{id: int64(i + 1), eventID: fmt.Appendf(nil, "%s-e%d", prefix, i), typ: []byte("T"), topic: []byte("t"),
				key: fmt.Appendf(nil, "%s-k%d", prefix, i), payload: []byte(strings.Repeat(fmt.Sprintf("%s%d;", prefix, i), i+1))}
			if i%2 == 0 {
				c.headers = fmt.Appendf(nil, `{"h":"%s-%d"}`, prefix, i)
			}
			cs = append(cs, c)
		}
		return cs
	}
	first := batch("a", 50)
	rows, err := readRows(&rd, first)
	if err != nil {
		t.Fatal(err)
	}
	rows[0].msg.Headers = append(rows[0].msg.Headers, sarama.RecordHeader{Key: []byte("added"), Value: []byte("x")})
	rows[0].msg.Headers = rows[0].msg.Headers[:len(rows[0].msg.Headers)-1]
	checkRows(t, rows, first)
	second := batch("b", 80)
	if _, err := readRows(&rd, second); err != nil {
		t.Fatal(err)
	}
	checkRows(t, rows, first)
}

// checkRows fails the test unless each of rows is the message refMessage makes of its
// testRow. The rows have at most one extra header, because refMessage adds them in map
// order.
func checkRows(t *testing.T, rows []outRow, cs []testRow) {
	t.Helper()
	for i, o := range rows {
		want, err := refMessage(cs[i])
		if err != nil {
			t.Fatal(err)
		}
		if g, w := encoded(t, o.msg.Value), encoded(t, want.Value); string(g) != string(w) {
			t.Fatalf("row %d value %q, want %q", i, g, w)
		}
		if g, w := encoded(t, o.msg.Key), encoded(t, want.Key); string(g) != string(w) {
			t.Fatalf("row %d key %q, want %q", i, g, w)
		}
		if g, w := headerText(o.msg.Headers), headerText(want.Headers); !slices.Equal(g, w) {
			t.Fatalf("row %d headers %v, want %v", i, g, w)
		}
		if o.eventID != string(cs[i].eventID) || o.key != string(cs[i].key) {
			t.Fatalf("row %d: event %q key %q", i, o.eventID, o.key)
		}
	}
}

// TestRowReaderAllocsPerBatch checks that reading a batch allocates a few times per batch,
// not per row.
func TestRowReaderAllocsPerBatch(t *testing.T) {
	const n, most = 200, 12
	raws := make([][8]sql.RawBytes, n)
	for i := range raws {
		raws[i] = testRow{id: int64(i + 1), eventID: fmt.Appendf(nil, "e%d", i), typ: []byte("T"), topic: []byte("t"),
			key: fmt.Appendf(nil, "k%d", i), payload: []byte(`{"order":1}`), headers: []byte(`{"a":"1","b":"2"}`),
			traceP: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}.raw()
	}
	var rd rowReader
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := readRaw(&rd, raws); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > most {
		t.Errorf("%.0f allocations for a batch of %d rows, want at most %d", allocs, n, most)
	} else {
		t.Logf("%.0f allocations for a batch of %d rows", allocs, n)
	}
}

// TestRowReaderRecycle checks the reuse of a batch that a relay recycles once its Kafka
// transaction ended. The next read reuses its buffers and message slices, with one
// allocation per batch for its strings. A batch not recycled makes all of them anew. The
// recycled batch's strings stay as they were. The new batch's messages are the rows' own,
// with every field Sarama writes zeroed.
func TestRowReaderRecycle(t *testing.T) {
	const n = 200
	rowsOf := func(prefix string) []testRow {
		cs := make([]testRow, n)
		for i := range cs {
			cs[i] = testRow{id: int64(i + 1), eventID: fmt.Appendf(nil, "%s-e%d", prefix, i), typ: []byte("T"), topic: []byte("t"),
				key: fmt.Appendf(nil, "%s-k%d", prefix, i), payload: fmt.Appendf(nil, `{"order":"%s%d"}`, prefix, i), headers: fmt.Appendf(nil, `{"h":"%s%d"}`, prefix, i)}
		}
		return cs
	}
	raws := make([][8]sql.RawBytes, n)
	for i, c := range rowsOf("x") {
		raws[i] = c.raw()
	}
	var plain, recycled rowReader
	fresh := testing.AllocsPerRun(20, func() {
		if _, err := readRaw(&plain, raws); err != nil {
			t.Fatal(err)
		}
	})
	reused := testing.AllocsPerRun(20, func() {
		if _, err := readRaw(&recycled, raws); err != nil {
			t.Fatal(err)
		}
		recycled.recycle()
	})
	if reused > 1 || fresh < 5 {
		t.Errorf("%.0f allocations per recycled batch (want at most 1: the strings), %.0f per batch not recycled", reused, fresh)
	}

	var rd rowReader
	first := rowsOf("a")
	rows, err := readRows(&rd, first)
	if err != nil {
		t.Fatal(err)
	}
	ev, key, topic := rows[7].eventID, rows[7].key, rows[7].topic
	rows[3].msg.Partition, rows[3].msg.Offset = 5, 99 // as Sarama leaves them
	rd.recycle()
	second := rowsOf("bb")
	again, err := readRows(&rd, second)
	if err != nil {
		t.Fatal(err)
	}
	if &again[0] != &rows[0] {
		t.Fatal("the recycled batch's rows were not reused")
	}
	if ev != "a-e7" || key != "a-k7" || topic != "t" {
		t.Errorf("a recycled batch's strings changed: %q %q %q", ev, key, topic)
	}
	if m := again[3].msg; m.Partition != 0 || m.Offset != 0 {
		t.Errorf("a reused message kept Sarama's fields: partition %d offset %d", m.Partition, m.Offset)
	}
	checkRows(t, again, second)

	// A batch of big rows is not kept between batches.
	big := rowsOf("c")
	for i := range big {
		big[i].payload = []byte(strings.Repeat("p", recycleMaxBytes/n+1))
	}
	if _, err := readRows(&rd, big); err != nil {
		t.Fatal(err)
	}
	rd.recycle()
	if rd.spare != nil {
		t.Errorf("a batch of %d MiB was kept for reuse (at most %d MiB)", n*(recycleMaxBytes/n+1)>>20, recycleMaxBytes>>20)
	}
}

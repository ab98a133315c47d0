package outbox

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/tracex"
)

// rowReader turns the outbox rows a relay reads into Kafka messages, with a few allocations
// per batch and not per row. The rows have the columns id, event_id, event_type, topic,
// msg_key, payload, headers and trace_parent. Each column is scanned as sql.RawBytes, the
// driver's buffer. Its bytes are copied once into the batch's buffers. The batch's
// messages, headers and encoders are made one slice each when its rows are read.
//
// A later batch reuses a batch's buffers only once its relay calls recycle. The relay does
// so after the batch's Kafka transaction committed, when neither Sarama nor the relay holds
// its messages any more. A message's bytes must not change while Sarama holds it. The
// strings of a batch are never reused. They are its event ids, topics, keys and trace
// parents.
//
// A message's key is msg_key and its value is payload. Its headers are event_id and
// event_type, then traceparent, then the row's extra headers in the JSON object's order.
// traceparent is the row's trace_parent, when it has one, and it replaces an extra header
// of that name. The extra headers are the column headers, a JSON object of strings.
type rowReader struct {
	raw  [8]sql.RawBytes
	dest [8]any
	// The last batch's buffer sizes are the next batch's first guess.
	bufHint, strHint, rowHint, extraHint int
	last, spare                          *rowBatch // the last batch rows made, and one recycled for the next start
}

// recycleMaxBytes bounds the buffers a relay keeps between batches. A batch of bigger rows
// gives its buffers to the collector.
const recycleMaxBytes = 4 << 20

// span is a part of a batch's buffer. A row is at most MEDIUMBLOB's 16 MiB, so int32 is
// enough.
type span struct{ off, n int32 }

// scannedRow is a row of a rowBatch, as parts of its buffers.
type scannedRow struct {
	id                              int64
	eventID, typ, trace, key, value span  // in buf
	strEventID, topic, strKey, tp   span  // in strs (tp: trace_parent)
	extraFrom, extraTo, headers     int32 // extra headers: extra[extraFrom:extraTo] (key, value pairs); headers in all
	traceValid, valueNull           bool  // trace_parent, payload are not NULL, are NULL
}

// rowBatch is the rows of one read, until rows makes their messages.
type rowBatch struct {
	buf   []byte // the messages' bytes: event ids, types, trace parents, payloads, extra headers
	strs  []byte // event ids, topics, keys, trace parents: one string for the batch
	rows  []scannedRow
	extra []span // in buf: key, value, key, value…

	// The messages rows made of the batch, kept for a batch that reuses these buffers.
	out  []outRow
	msgs []sarama.ProducerMessage
	encs []sarama.ByteEncoder
	hdrs []sarama.RecordHeader
}

// start begins a batch.
func (r *rowReader) start() *rowBatch {
	if r.dest[0] == nil {
		for i := range r.raw {
			r.dest[i] = &r.raw[i]
		}
	}
	if b := r.spare; b != nil {
		r.spare = nil
		b.buf, b.strs, b.rows, b.extra = b.buf[:0], b.strs[:0], b.rows[:0], b.extra[:0]
		return b
	}
	return &rowBatch{
		buf:   make([]byte, 0, max(r.bufHint, 512)),
		strs:  make([]byte, 0, max(r.strHint, 256)),
		rows:  make([]scannedRow, 0, max(r.rowHint, 8)),
		extra: make([]span, 0, r.extraHint),
	}
}

// scan reads rows' current row and returns its id; keep adds it to b.
func (r *rowReader) scan(rows *sql.Rows) (int64, error) {
	if err := rows.Scan(r.dest[:]...); err != nil {
		return 0, fmt.Errorf("scan outbox row: %w", err)
	}
	id, err := strconv.ParseInt(string(r.raw[0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("scan outbox row: id: %w", err)
	}
	return id, nil
}

// keepHanded adds a row of the hand-off to b as keep adds the row a read gives. Its values
// are those the Writer inserted, so the message is the one a read of the row makes.
func (r *rowReader) keepHanded(b *rowBatch, id int64, h *handedRow) error {
	r.raw[0] = nil
	for i, v := range h.vals {
		r.raw[i+1] = rawOf(v)
	}
	err := r.keep(b, id)
	clear(r.raw[:])
	return err
}

// keep adds the row scan read last to b.
func (r *rowReader) keep(b *rowBatch, id int64) error {
	raw := &r.raw
	s := scannedRow{id: id, traceValid: raw[7] != nil, valueNull: raw[5] == nil}
	s.eventID = b.add(raw[1])
	s.typ = b.add(raw[2])
	s.key = b.add(raw[4])
	s.value = b.add(raw[5])
	s.strEventID = b.addStr(raw[1])
	s.topic = b.addStr(raw[3])
	s.strKey = b.addStr(raw[4])
	s.tp = b.addStr(raw[7])
	traced := len(raw[7]) > 0
	s.headers = 2
	if traced {
		s.trace = b.add(raw[7])
		s.headers++
	}
	s.extraFrom = int32(len(b.extra))
	if js := raw[6]; len(js) > 0 {
		if err := b.addHeaders(js, traced); err != nil {
			return fmt.Errorf("outbox row %d headers: %w", id, err)
		}
	}
	s.extraTo = int32(len(b.extra))
	s.headers += (s.extraTo - s.extraFrom) / 2
	b.rows = append(b.rows, s)
	return nil
}

// size is the bytes the batch's rows hold so far, which RelayConfig.BatchBytes bounds.
func (b *rowBatch) size() int { return len(b.buf) + len(b.strs) }

func (b *rowBatch) add(p []byte) span {
	s := span{int32(len(b.buf)), int32(len(p))}
	b.buf = append(b.buf, p...)
	return s
}

func (b *rowBatch) addStr(p []byte) span {
	s := span{int32(len(b.strs)), int32(len(p))}
	b.strs = append(b.strs, p...)
	return s
}

// addHeaders adds the extra headers of the JSON object js. It leaves out traceparent when
// the row is traced. It adds the object's bytes when plainHeaders reads it, and otherwise
// what encoding/json decodes.
func (b *rowBatch) addHeaders(js []byte, traced bool) error {
	from := len(b.extra)
	var ok bool
	if b.extra, ok = plainHeaders(js, b.extra); ok {
		parts := b.extra[from:]
		kept := 0
		for i := 0; i < len(parts); i += 2 {
			k, v := js[parts[i].off:parts[i].off+parts[i].n], js[parts[i+1].off:parts[i+1].off+parts[i+1].n]
			if traced && string(k) == tracex.Header {
				continue
			}
			parts[kept], parts[kept+1] = b.add(k), b.add(v)
			kept += 2
		}
		b.extra = b.extra[:from+kept]
		return nil
	}
	b.extra = b.extra[:from]
	var extra map[string]string
	if err := json.Unmarshal(js, &extra); err != nil {
		return err
	}
	for k, v := range extra {
		if traced && k == tracex.Header {
			continue
		}
		b.extra = append(b.extra, b.add([]byte(k)), b.add([]byte(v)))
	}
	return nil
}

// plainHeaders appends to out the key and value of every member of js, in order, as spans
// of js. It does so when js is a JSON object whose keys and values are strings of valid
// UTF-8 without escapes, and whose keys are all different. encoding/json then reads it as
// exactly those bytes. ok is false for anything else. encoding/json then decodes it, or
// says why it cannot.
func plainHeaders(js []byte, out []span) (_ []span, ok bool) {
	i := skipSpace(js, 0)
	if i == len(js) || js[i] != '{' {
		return out, false
	}
	from := len(out)
	i = skipSpace(js, i+1)
	if i < len(js) && js[i] == '}' {
		return out, skipSpace(js, i+1) == len(js)
	}
	for {
		k, next, ok := plainString(js, i)
		if !ok {
			return out, false
		}
		for j := from; j < len(out); j += 2 {
			if string(js[out[j].off:out[j].off+out[j].n]) == string(js[k.off:k.off+k.n]) {
				return out, false
			}
		}
		i = skipSpace(js, next)
		if i == len(js) || js[i] != ':' {
			return out, false
		}
		v, next, ok := plainString(js, skipSpace(js, i+1))
		if !ok {
			return out, false
		}
		out = append(out, k, v)
		i = skipSpace(js, next)
		if i == len(js) {
			return out, false
		}
		switch js[i] {
		case ',':
			i = skipSpace(js, i+1)
		case '}':
			return out, skipSpace(js, i+1) == len(js)
		default:
			return out, false
		}
	}
}

// plainString reads the JSON string at js[i] when it has no escapes and is valid UTF-8. It
// returns the string's contents and the index after its closing quote.
func plainString(js []byte, i int) (span, int, bool) {
	if i >= len(js) || js[i] != '"' {
		return span{}, 0, false
	}
	for j := i + 1; j < len(js); j++ {
		switch c := js[j]; {
		case c == '"':
			if !utf8.Valid(js[i+1 : j]) {
				return span{}, 0, false
			}
			return span{int32(i + 1), int32(j - i - 1)}, j + 1, true
		case c == '\\' || c < 0x20:
			return span{}, 0, false
		}
	}
	return span{}, 0, false
}

func skipSpace(js []byte, i int) int {
	for i < len(js) && (js[i] == ' ' || js[i] == '\t' || js[i] == '\n' || js[i] == '\r') {
		i++
	}
	return i
}

// rows makes b's messages, with one slice each of rows, messages, encoders and headers.
func (r *rowReader) rows(b *rowBatch) []outRow {
	r.bufHint, r.strHint, r.rowHint, r.extraHint = len(b.buf), len(b.strs), len(b.rows), len(b.extra)
	n := len(b.rows)
	if n == 0 {
		r.spare = b // nothing refers to an empty batch, so the next start takes it again
		return nil
	}
	strs := string(b.strs)
	str := func(s span) string { return strs[s.off : s.off+s.n] }
	bytes := func(s span) []byte { return b.buf[s.off : s.off+s.n : s.off+s.n] }
	headers := 0
	for _, s := range b.rows {
		headers += int(s.headers)
	}
	r.last = b
	out := reuse(b.out, n)
	msgs := reuse(b.msgs, n)   // zeroed, since Sarama writes its own fields into each
	encs := reuse(b.encs, 2*n) // a pointer in an Encoder allocates nothing more
	hdrs := reuse(b.hdrs, headers)[:0]
	b.out, b.msgs, b.encs, b.hdrs = out, msgs, encs, hdrs[:headers]
	for i, s := range b.rows {
		from := len(hdrs)
		hdrs = append(hdrs,
			sarama.RecordHeader{Key: headerEventIDKey, Value: bytes(s.eventID)},
			sarama.RecordHeader{Key: headerEventTypeKey, Value: bytes(s.typ)})
		if s.trace.n > 0 {
			hdrs = append(hdrs, sarama.RecordHeader{Key: headerTraceKey, Value: bytes(s.trace)})
		}
		for j := s.extraFrom; j < s.extraTo; j += 2 {
			hdrs = append(hdrs, sarama.RecordHeader{Key: bytes(b.extra[j]), Value: bytes(b.extra[j+1])})
		}
		o := &out[i]
		o.id, o.eventID, o.topic, o.key = s.id, str(s.strEventID), str(s.topic), str(s.strKey)
		o.trace = sql.NullString{String: str(s.tp), Valid: s.traceValid}
		encs[2*i], encs[2*i+1] = bytes(s.value), bytes(s.key)
		if s.valueNull {
			encs[2*i] = nil
		}
		m := &msgs[i]
		m.Topic, m.Key, m.Value = o.topic, &encs[2*i+1], &encs[2*i]
		m.Headers = hdrs[from:len(hdrs):len(hdrs)] // capped, so an append never writes into the next message's
		o.msg = m
	}
	return out
}

// recycle lets the next start reuse the buffers of the batch rows made last. Its caller no
// longer holds any of that batch's messages. Nor does Sarama, because the batch's Kafka
// transaction ended. The batch's strings stay as they are.
func (r *rowReader) recycle() {
	b := r.last
	r.last = nil
	if b == nil || cap(b.buf)+cap(b.strs) > recycleMaxBytes {
		return
	}
	r.spare = b
}

// reuse returns s[:n] zeroed when s has room for n, else a new slice of n.
func reuse[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

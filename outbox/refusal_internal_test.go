package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func row(id int64, key, topic string) outRow {
	return outRow{id: id, eventID: fmt.Sprintf("e%d", id), key: key, topic: topic,
		msg: &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder("v")}}
}

func ids(rows []outRow) []int64 {
	var out []int64
	for _, o := range rows {
		out = append(out, o.id)
	}
	return out
}

// fakeMetadata knows the topics in have. refreshes counts forced refreshes.
type fakeMetadata struct {
	have      map[string]bool
	refreshes int
	err       error
}

func (f *fakeMetadata) Partitions(topic string) ([]int32, error) {
	if f.err != nil {
		return nil, f.err
	}
	if f.have[topic] {
		return []int32{0}, nil
	}
	return nil, sarama.ErrUnknownTopicOrPartition
}

func (f *fakeMetadata) RefreshMetadata(...string) error { f.refreshes++; return nil }

// screen keeps each key's order. Rows after a parked row, existing or new in the batch, are
// held behind it. Rows after one that another relay holds stay, and so do rows of released
// keys.
func TestScreen(t *testing.T) {
	md := &fakeMetadata{have: map[string]bool{"good": true}}
	rows := []outRow{
		row(1, "a", "good"),
		row(2, "b", "missing"), // refused: b's later rows held behind e2
		row(3, "a", "good"),
		row(4, "b", "good"),
		row(5, "c", "good"), // c has a parked event: held behind it
		{id: 6, key: "d"},   // another relay holds it: d's later rows stay
		row(7, "d", "good"),
		row(8, "e", "good"), // released meanwhile: stays for the next batch
		row(9, "f", "missing"),
	}
	s, err := screen(rows, map[string]string{"c": "old-c"}, map[string]bool{"e": true}, &checker{md: md})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(s.send); !slices.Equal(got, []int64{1, 3}) {
		t.Errorf("send %v, want [1 3]", got)
	}
	var parked []string
	for _, e := range s.park {
		parked = append(parked, fmt.Sprintf("%d:%s:%s:%v", e.row.id, e.reason, e.behind, e.existing))
	}
	want := []string{"2:unknown_topic::false", "4:held:e2:false", "5:held:old-c:true", "9:unknown_topic::false"}
	if !slices.Equal(parked, want) {
		t.Errorf("parked %v, want %v", parked, want)
	}
	if s.kept != 3 {
		t.Errorf("kept %d, want 3 (6, 7, 8)", s.kept)
	}
	if !strings.Contains(s.park[0].err, "topic missing does not exist") || !strings.Contains(s.park[0].err, "e2") {
		t.Errorf("refusal text %q does not name the topic and the event", s.park[0].err)
	}
	if md.refreshes != 1 {
		t.Errorf("%d forced metadata refreshes, want 1 (the missing topic, once per batch)", md.refreshes)
	}

	// A topic that appears on the forced refresh is not refused. Metadata errors fail the
	// batch.
	appears := &fakeMetadata{have: map[string]bool{}}
	c := &checker{md: &refreshAdds{appears, "new"}}
	if f, err := c.check(row(1, "a", "new")); f != nil || err != nil {
		t.Errorf("topic created a moment ago: %v %v, want sent", f, err)
	}
	down := &checker{md: &fakeMetadata{err: sarama.ErrOutOfBrokers}}
	if _, err := screen([]outRow{row(1, "a", "x")}, nil, nil, down); err == nil || !strings.Contains(err.Error(), "e1") {
		t.Errorf("metadata unreachable: %v, want the batch's error naming the event", err)
	}
	big := &checker{maxBytes: 100}
	o := row(1, "a", "t")
	o.msg.Value = sarama.ByteEncoder(strings.Repeat("x", 200))
	if f, _ := big.check(o); f == nil || f.reason != ReasonTooLarge || !errors.Is(f.err, sarama.ErrMessageSizeTooLarge) {
		t.Errorf("oversized row: %+v, want too_large", f)
	}
}

type refreshAdds struct {
	*fakeMetadata
	topic string
}

func (r *refreshAdds) RefreshMetadata(...string) error {
	r.have[r.topic] = true
	return nil
}

func TestReleasedKeys(t *testing.T) {
	before := map[string]string{"a": "e1", "b": "e2", "c": "e3"}
	after := map[string]string{"a": "e1", "c": "e9", "d": "e4"}
	got := releasedKeys(before, after)
	if len(got) != 2 || !got["b"] || !got["c"] {
		t.Fatalf("released %v, want b (retried) and c (its event changed)", got)
	}
}

// isolation halves the suspects batch by batch until one row alone is refused.
func TestIsolation(t *testing.T) {
	var rows []outRow
	for i := range 16 {
		rows = append(rows, row(int64(i+1), fmt.Sprintf("k%d", i), "t"))
	}
	const culprit = 11
	var s isolation
	all := make([]int, len(rows))
	for i := range all {
		all[i] = i
	}
	if g := s.outcome(rows, all); g != nil { // every row failed alike
		t.Fatalf("guilty %v after an ambiguous failure", g)
	}
	for round := 0; round < 10; round++ {
		batch := s.cut(rows)
		var refused []int
		if slices.ContainsFunc(batch, func(o outRow) bool { return o.id == culprit }) {
			for i := range batch {
				refused = append(refused, i) // the culprit fails the whole batch
			}
		}
		if g := s.outcome(batch, refused); g != nil {
			if len(g) != 1 || batch[g[0]].id != culprit {
				t.Fatalf("round %d: guilty %v of %v, want only %d", round, g, ids(batch), culprit)
			}
			return
		}
		if len(refused) == 0 {
			rows = slices.DeleteFunc(rows, func(o outRow) bool { return slices.Contains(ids(batch), o.id) })
		}
	}
	t.Fatal("the culprit was not found in 10 rounds")
}

func TestIsolationCut(t *testing.T) {
	rows := []outRow{row(1, "a", "t"), row(2, "b", "t"), row(3, "c", "t"), row(4, "d", "t"), row(5, "e", "t")}
	s := isolation{suspects: map[int64]bool{3: true, 4: true, 5: true}}
	if got := ids(s.cut(rows)); !slices.Equal(got, []int64{1, 2}) {
		t.Errorf("cut %v, want the rows before the first suspect", got)
	}
	if got := ids(s.cut(rows[2:])); !slices.Equal(got, []int64{3, 4}) {
		t.Errorf("cut %v, want the first two of three suspects", got)
	}
	if g := s.outcome(rows[2:4], []int{1}); !slices.Equal(g, []int{1}) {
		t.Errorf("one refusal in a batch: guilty %v, want it", g)
	}
	if len(s.suspects) != 1 || !s.suspects[5] {
		t.Errorf("suspects %v, want 5 left", s.suspects)
	}
}

func TestRefusalReason(t *testing.T) {
	for _, tc := range []struct {
		err    error
		reason string
	}{
		{sarama.ErrMessageSizeTooLarge, ReasonTooLarge},
		{sarama.ErrMessageSetSizeTooLarge, ReasonTooLarge},
		{sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2 > 1"), ReasonTooLarge},
		{sarama.ErrInvalidRecord, ReasonInvalidRecord},
		{sarama.ErrInvalidMessage, ReasonInvalidRecord},
		{sarama.ErrInvalidTopic, ReasonInvalidRecord},
		{sarama.ErrTopicAuthorizationFailed, ReasonUnauthorized},
		{fmt.Errorf("wrapped: %w", sarama.ErrTopicAuthorizationFailed), ReasonUnauthorized},
		{sarama.ErrUnknownTopicOrPartition, ""}, // confirmed by the next batch's check
		{sarama.ErrNotEnoughReplicas, ""},
		{sarama.ErrOutOfBrokers, ""},
		{sarama.ConfigurationError("Producing headers requires Kafka at least v0.11"), ""},
	} {
		if got, ok := refusalReason(tc.err); got != tc.reason || ok != (tc.reason != "") {
			t.Errorf("refusalReason(%v) = %q, %v; want %q", tc.err, got, ok, tc.reason)
		}
	}
}

// sortSend matches producer errors back to their rows. Rows without one were acked.
func TestSortSend(t *testing.T) {
	batch := []outRow{row(1, "a", "t"), row(2, "b", "t"), row(3, "c", "u")}
	pos := &sarama.ProducerMessage{Topic: "positions"}
	err := sarama.ProducerErrors{
		{Msg: batch[2].msg, Err: sarama.ErrUnknownTopicOrPartition},
		{Msg: batch[1].msg, Err: sarama.ErrMessageSizeTooLarge},
		{Msg: pos, Err: sarama.ErrMessageSizeTooLarge},
	}
	res := sortSend(batch, pos, err)
	if !slices.Equal(res.refused, []int{1}) || res.reasons[1] != ReasonTooLarge || res.failed != 1 ||
		!slices.Equal(res.unknown, []string{"u"}) || res.extraErr == nil || !strings.Contains(res.firstFail, "e2") {
		t.Errorf("sortSend = %+v", res)
	}
	if _, acked := res.errs[0]; acked {
		t.Error("row 1 has an error; it was acked")
	}
	whole := sortSend(batch, nil, errors.New("broker down"))
	if whole.failed != 3 || len(whole.refused) != 0 {
		t.Errorf("an error not tied to messages: %+v, want every row failed", whole)
	}
}

type nopProducer struct{}

func (nopProducer) SendMessages([]*sarama.ProducerMessage) error { return nil }

// Holding a row behind an event parked before the batch checks, under the event's row lock,
// that the event is still parked. If it was retried or dropped meanwhile, the row stays in
// the outbox.
func TestParkChecksTheEventHeldBehind(t *testing.T) {
	d := testenv.DB(t, 2)
	ctx := context.Background()
	w, _ := NewWriter("")
	w.WithDialect(testenv.Dialect())
	if err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		return w.AddBatch(ctx, tx, []Event{{ID: "e1", Type: "T", Topic: "t", Key: "k", Payload: []byte("1")},
			{ID: "e2", Type: "T", Topic: "t", Key: "k", Payload: []byte("2")}})
	}); err != nil {
		t.Fatal(err)
	}
	var id1, id2 int64
	if err := d.DB.QueryRow("SELECT MIN(id), MAX(id) FROM outbox").Scan(&id1, &id2); err != nil {
		t.Fatal(err)
	}
	r, err := NewRelay(d.DB, nopProducer{}, RelayConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	park := func(entries ...parkEntry) (moved []parkEntry, kept map[string]bool) {
		t.Helper()
		if err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
			var err error
			moved, kept, err = r.park(ctx, tx, entries)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return moved, kept
	}
	moved, kept := park(parkEntry{row: outRow{id: id2, eventID: "e2", key: "k"}, reason: ReasonHeld, behind: "gone", existing: true})
	if len(moved) != 0 || !kept["k"] {
		t.Fatalf("held behind an event no longer parked: moved %d, kept %v; want none moved, k kept", len(moved), kept)
	}
	moved, _ = park(parkEntry{row: outRow{id: id1, eventID: "e1", key: "k", topic: "t"}, reason: ReasonTooLarge, err: "too large"})
	if len(moved) != 1 {
		t.Fatalf("refused row: moved %d, want 1", len(moved))
	}
	moved, kept = park(parkEntry{row: outRow{id: id2, eventID: "e2", key: "k"}, reason: ReasonHeld, behind: "e1", existing: true})
	if len(moved) != 1 || len(kept) != 0 {
		t.Fatalf("held behind a parked event: moved %d, kept %v; want 1, none", len(moved), kept)
	}
	var outboxRows, parkedRows int
	var behind string
	_ = d.DB.QueryRow("SELECT COUNT(*) FROM outbox").Scan(&outboxRows)
	_ = d.DB.QueryRow("SELECT COUNT(*), MAX(COALESCE(held_behind, '')) FROM outbox_parked").Scan(&parkedRows, &behind)
	if outboxRows != 0 || parkedRows != 2 || behind != "e1" {
		t.Fatalf("outbox %d rows, parked %d (held behind %q); want 0, 2, e1", outboxRows, parkedRows, behind)
	}
}

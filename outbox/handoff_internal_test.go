package outbox

import (
	"strings"
	"testing"
)

// newHandoff is a hand-off whose rows all belong to a shard its relay owns.
func newHandoff(max int) *handoff {
	e := &eosShard{}
	e.owner.Store(true)
	h := &handoff{max: max, rows: map[int64]handedRow{}}
	h.relays.Store(&[]*eosRelay{{shards: []*eosShard{e}}})
	return h
}

func handedArgs(n int, payload string) []any {
	args := make([]any, 0, n*rowWidth)
	for i := range n {
		args = append(args, "e"+string(rune('a'+i)), "T", "topic", "k", []byte(payload), nil, nil)
	}
	return args
}

// TestHandoffTakeChecksEveryRow checks that a batch is taken from the hand-off only when
// the hand-off holds every row with the key hash the database gives. With one missing row
// or one other hash, take returns nil and the batch is read back.
func TestHandoffTakeChecksEveryRow(t *testing.T) {
	h := newHandoff(1 << 20)
	h.put([]int64{10, 11, 12}, []int64{1, 2, 3}, handedArgs(3, "p"))
	if got := h.take([]int64{10, 11, 12}, []int64{1, 2, 3}, nil); len(got) != 3 || got[1].vals[0] != any("eb") {
		t.Fatalf("take of handed rows = %v", got)
	}
	if got := h.take([]int64{10, 11, 12}, []int64{1, 9, 3}, nil); got != nil {
		t.Fatalf("take with another key hash for row 11 = %v, want nil (read back)", got)
	}
	if got := h.take([]int64{10, 11, 12, 13}, []int64{1, 2, 3, 4}, nil); got != nil {
		t.Fatalf("take with row 13 never handed = %v, want nil", got)
	}
	if h.hits.Load() != 1 || h.misses.Load() != 2 {
		t.Fatalf("hits %d, misses %d; want 1, 2", h.hits.Load(), h.misses.Load())
	}
	h.drop([]int64{10, 11, 12})
	if len(h.rows) != 0 || h.bytes != 0 {
		t.Fatalf("after drop: %d rows, %d bytes", len(h.rows), h.bytes)
	}
}

// TestHandoffBoundedByBytes checks that a full hand-off takes no more rows, which are then
// read back. It takes rows again once published rows are dropped.
func TestHandoffBoundedByBytes(t *testing.T) {
	big := strings.Repeat("x", 1000)
	h := newHandoff(3 * (rowOverhead + 1000 + 10))
	h.put([]int64{1, 2, 3, 4, 5}, []int64{0, 0, 0, 0, 0}, handedArgs(5, big))
	if len(h.rows) != 3 || h.bytes > h.max || h.full.Load() != 2 || h.handed.Load() != 3 {
		t.Fatalf("%d rows, %d of %d bytes, %d full, %d handed; want 3 rows within max, 2 full", len(h.rows), h.bytes, h.max, h.full.Load(), h.handed.Load())
	}
	if _, ok := h.rows[4]; ok {
		t.Fatal("row 4 taken beyond max")
	}
	h.drop([]int64{1, 2})
	h.put([]int64{6}, []int64{0}, handedArgs(1, big))
	if _, ok := h.rows[6]; !ok || len(h.rows) != 2 {
		t.Fatalf("after two rows published: %d rows, row 6 taken %v", len(h.rows), ok)
	}
}

// TestHandoffDropStale checks which rows dropStale drops. Some rows were handed before a
// read started and have ids below the oldest pending id that read found. Another relay
// published them, and they are dropped. A row handed after the read started is kept
// whatever its id, because its transaction may have committed after a later id's.
func TestHandoffDropStale(t *testing.T) {
	h := newHandoff(1 << 20)
	h.put([]int64{1, 2, 5}, []int64{0, 0, 0}, handedArgs(3, "p"))
	mark := h.mark()
	h.put([]int64{3}, []int64{0}, handedArgs(1, "p")) // committed after the read started
	h.dropStale(4, mark, 0, 1)
	for id, want := range map[int64]bool{1: false, 2: false, 3: true, 5: true} {
		if _, ok := h.rows[id]; ok != want {
			t.Errorf("row %d kept = %v, want %v", id, ok, want)
		}
	}
	// With two shards, shard 0's read says nothing of row 7, whose key hash 1 puts it in
	// shard 1.
	h = newHandoff(1 << 20)
	h.put([]int64{6, 7, 8}, []int64{2, 1, 4}, handedArgs(3, "p"))
	h.dropStale(10, h.mark(), 0, 2)
	for id, want := range map[int64]bool{6: false, 7: true, 8: true} {
		if _, ok := h.rows[id]; ok != want {
			t.Errorf("two shards: row %d kept = %v, want %v", id, ok, want)
		}
	}
}

// TestHandedWithinBatchBytes checks that a batch taken from the hand-off stops, as a read
// does, at the row that reaches RelayConfig.BatchBytes, and always holds one row.
func TestHandedWithinBatchBytes(t *testing.T) {
	rows := []handedRow{{size: 40}, {size: 40}, {size: 40}, {size: 40}}
	for _, c := range []struct{ limit, want int }{{1, 1}, {40, 1}, {41, 2}, {100, 3}, {120, 3}, {121, 4}, {1 << 20, 4}} {
		if got := len(handedWithin(rows, c.limit)); got != c.want {
			t.Errorf("limit %d: %d rows, want %d", c.limit, got, c.want)
		}
	}
	if got := handedWithin(rows[:0], 1); len(got) != 0 {
		t.Errorf("no rows: %d rows", len(got))
	}
}

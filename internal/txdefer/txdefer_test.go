package txdefer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
)

type recorder struct {
	name  string
	calls *[]string
	fail  error
}

func (r *recorder) FlushDeferred(_ context.Context, _ *sql.Tx, rows [][]any) error {
	*r.calls = append(*r.calls, fmt.Sprint(r.name, rows))
	return r.fail
}

func TestSet(t *testing.T) {
	tx, other := &sql.Tx{}, &sql.Tx{}
	s := New(tx)
	ctx := With(context.Background(), s)
	if From(ctx, tx) != s || From(ctx, other) != nil || From(context.Background(), tx) != nil || From(ctx, nil) != nil {
		t.Fatal("From must return the Set only for its own transaction")
	}
	var calls []string
	a, b := &recorder{name: "a", calls: &calls}, &recorder{name: "b", calls: &calls}
	s.Add(b, []any{1})
	s.Add(a, []any{2})
	m := s.Mark()
	s.Add(b, []any{3})
	s.Truncate(m) // the rows of a delivery rolled back to its savepoint
	s.Add(b, []any{4})
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(calls), "[b[[1] [4]] a[[2]]]"; got != want {
		t.Fatalf("flushed %s, want %s (each Flusher once, in the order of its first row, rows in order)", got, want)
	}
	if s.Len() != 0 {
		t.Fatal("a flushed Set must be empty")
	}
	calls = nil
	s.Add(&recorder{name: "c", calls: &calls, fail: errors.New("duplicate")}, []any{5})
	if err := s.Flush(context.Background()); err == nil {
		t.Fatal("a Flusher's error must come back")
	}
}

// Take hands the waiting rows over in order, with their Flushers, and writes nothing.
func TestTake(t *testing.T) {
	s := New(&sql.Tx{})
	var calls []string
	a := &recorder{name: "a", calls: &calls}
	s.Add(a, []any{1})
	s.Add(a, []any{2})
	rows := s.Take()
	if len(rows) != 2 || rows[0].Flusher != a || fmt.Sprint(rows[0].Values, rows[1].Values) != "[1] [2]" {
		t.Fatalf("Take returned %v", rows)
	}
	if s.Len() != 0 || len(calls) != 0 {
		t.Fatalf("after Take: %d rows wait, %d flushes", s.Len(), len(calls))
	}
}

package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// TestInserterRefusesBadInput checks that bad input to an Inserter is refused with an error
// that names it.
func TestInserterRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		table string
		cols  []string
		want  string
	}{
		{"credit; DROP TABLE x", []string{"a"}, "invalid inserter table"},
		{"credit", nil, "no columns"},
		{"credit", []string{"a", "b c"}, `invalid column of inserter credit "b c"`},
		{"credit", []string{"a", "a"}, `column "a" given twice`},
	} {
		if _, err := inbox.NewInserter(c.table, c.cols...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewInserter(%q, %q): %v, want an error with %q", c.table, c.cols, err, c.want)
		}
	}
	ins, err := inbox.NewInserter("credit", "order_id", "points")
	if err != nil {
		t.Fatal(err)
	}
	// A wrong number of values is the handler's bug. It is permanent, found before any
	// round trip.
	if err := ins.Insert(context.Background(), nil, "o-1"); !errors.Is(err, inbox.ErrPermanent) || !strings.Contains(err.Error(), "1 values for 2 columns (order_id, points)") {
		t.Errorf("Insert with one value of two: %v, want a permanent error naming the columns", err)
	}
	for _, clause := range []string{"", "  ", "n = 1; DROP TABLE credit"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("OnDuplicateKeyUpdate(%q) did not panic", clause)
				}
			}()
			ins.OnDuplicateKeyUpdate(clause)
		}()
	}
	for _, c := range [][2]string{{"order_id", ""}, {"order_id", "n = 1; DROP TABLE credit"}, {"order id", "points = 1"}, {"", "points = 1"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("OnConflictUpdate(%q, %q) did not panic", c[0], c[1])
				}
			}()
			ins.OnConflictUpdate(c[0], c[1])
		}()
	}
	// An upsert without its PostgreSQL form is refused there, before any round trip.
	up, err := inbox.NewInserter("balance", "user_id", "points")
	if err != nil {
		t.Fatal(err)
	}
	up.OnDuplicateKeyUpdate("points = points + VALUES(points)")
	pg := dbx.ContextWithDialect(context.Background(), dbx.Postgres)
	if err := up.Insert(pg, nil, "u-1", 1); !errors.Is(err, inbox.ErrPermanent) || !strings.Contains(err.Error(), "OnConflictUpdate") {
		t.Errorf("an upsert without OnConflictUpdate on PostgreSQL: %v, want a permanent error naming OnConflictUpdate", err)
	}
}

package outbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func TestIDMatchForm(t *testing.T) {
	for _, c := range []struct {
		ids  []int64
		cond string
		args []any
	}{
		{[]int64{5, 6, 7, 8}, "(id BETWEEN ? AND ?)", []any{int64(5), int64(8)}},
		{[]int64{1, 2, 3, 9, 20, 21}, "(id BETWEEN ? AND ? OR id = ? OR id BETWEEN ? AND ?)", []any{int64(1), int64(3), int64(9), int64(20), int64(21)}},
		{[]int64{1, 3, 5}, "id IN (?,?,?)", []any{int64(1), int64(3), int64(5)}},
		{[]int64{7}, "id IN (?)", []any{int64(7)}},
		{[]int64{7, 8, 10}, "id IN (?,?,?)", []any{int64(7), int64(8), int64(10)}},
	} {
		for _, d := range dbx.Dialects {
			cond, args, _ := sqlText{d}.idMatch(c.ids)
			want, wantArgs := c.cond, c.args
			if d.IsPostgres() && strings.HasPrefix(want, "id IN") {
				want, wantArgs = "id = ANY(?)", []any{c.ids} // one int8[] argument
			}
			if cond != want || fmt.Sprint(args) != fmt.Sprint(wantArgs) {
				t.Errorf("%s: idMatch(%v) = %q %v, want %q %v", d, c.ids, cond, args, want, wantArgs)
			}
		}
	}
}

// TestIDMatchSelectsExactlyTheIDs runs idMatch's conditions on the database for random id sets
// (runs of consecutive ids, singles, scattered) and checks they match exactly the set; an
// off-by-one range would mark a row that was never published.
func TestIDMatchSelectsExactlyTheIDs(t *testing.T) {
	d := testenv.DB(t, 2)
	ctx := context.Background()
	fill := `INSERT INTO outbox (id, event_id, event_type, topic, msg_key, payload)
		SELECT seq, CONCAT('idm-', seq), 'T', 't', 'k', '' FROM seq_1_to_3000`
	dl := sqlText{dbx.DialectOf(d.DB)}
	if dl.IsPostgres() {
		fill = `INSERT INTO outbox (id, event_id, event_type, topic, msg_key, payload)
		SELECT seq, CONCAT('idm-', seq), 'T', 't', 'k', '' FROM generate_series(1, 3000) seq`
	}
	if _, err := d.DB.ExecContext(ctx, fill); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 40; trial++ {
		var ids []int64
		for id := int64(1 + rng.IntN(5)); id <= 3000; {
			run := 1 + rng.IntN([]int{1, 3, 400}[trial%3])
			for i := 0; i < run && id <= 3000; i++ {
				ids = append(ids, id)
				id++
			}
			id += int64(1 + rng.IntN(4))
		}
		cond, args, _ := dl.idMatch(ids)
		rows, err := d.DB.QueryContext(ctx, dl.Rebind("SELECT id FROM outbox WHERE "+cond+" ORDER BY id"), args...)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			got = append(got, id)
		}
		rows.Close()
		if !slices.Equal(got, ids) {
			t.Fatalf("trial %d: %q matched %d rows, want exactly the %d ids", trial, cond[:min(len(cond), 80)], len(got), len(ids))
		}
	}
}

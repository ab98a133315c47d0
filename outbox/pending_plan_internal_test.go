package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestPendingReadsUseUnpublishedIndex checks that the relays' reads of the oldest
// unpublished rows go through idx_unpublished in its order. The outbox keeps many
// published rows for the retention. The reads need no sort and no walk of the primary key
// over published rows. PostgreSQL's planner reads "published_at IS NULL ORDER BY id" as a
// walk of the primary key filtered on published_at. That walk passes every row kept for a
// week before the pending ones. Hence sqlText.pendingOrder gives PostgreSQL ORDER BY
// published_at, id.
func TestPendingReadsUseUnpublishedIndex(t *testing.T) {
	d := testenv.DB(t, 2)
	ctx := context.Background()
	// Many published rows for a batch, as the retention keeps: on a table of little more
	// than a batch a walk of the primary key is as cheap, and MariaDB takes it.
	batch := RelayConfig{}.WithDefaults().BatchSize
	published, pending := 20*batch, 50
	w, _ := NewWriter("")
	w.WithDialect(testenv.Dialect())
	for n := 0; n < published+pending; {
		var evs []Event
		for ; len(evs) < batchRows && n < published+pending; n++ {
			evs = append(evs, Event{ID: fmt.Sprintf("p-%06d", n), Type: "T", Topic: "t", Key: fmt.Sprintf("k%d", n%97), Payload: []byte("x")})
		}
		if err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error { return w.AddBatch(ctx, tx, evs) }); err != nil {
			t.Fatal(err)
		}
	}
	d.AdminExec(t, fmt.Sprintf("UPDATE outbox SET published_at = CURRENT_TIMESTAMP(6) WHERE id <= %d", published))
	dl := sqlText{dbx.DialectOf(d.DB)}
	analyze := "ANALYZE TABLE outbox"
	if dl.IsPostgres() {
		analyze = "ANALYZE outbox"
	}
	rows, err := d.Admin.QueryContext(ctx, analyze)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()

	alo, err := NewRelay(d.DB, nopProducer{}, RelayConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc := kafkax.Config{Brokers: testenv.Brokers()}
	one, err := NewExactlyOnceRelay(d.DB, kc, RelayConfig{TransactionalID: "plan", Shards: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	three, err := NewExactlyOnceRelay(d.DB, kc, RelayConfig{TransactionalID: "plan", Shards: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e1, e3 := one.engine.(*eosRelay).shards[0], three.engine.(*eosRelay).shards[1]
	p := int64(published)
	cond, cargs, _ := dl.idMatch([]int64{p + 1, p + 2, p + 3})
	for _, c := range []struct {
		name  string
		query string
		args  []any
	}{
		{"at-least-once pending ids", alo.engine.(*atLeastOnce).claimQ.pending, nil},
		{"exactly-once pending rows", e1.pendingQ, []any{batch}},
		{"exactly-once pending rows of shard 1 of 3", e3.pendingQ, []any{batch}},
		{"exactly-once pending rows past a marking batch", dl.Rebind(e1.pendingWhere + " AND NOT " + cond + e1.pendingOrder), append(cargs, batch)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if dl.IsPostgres() {
				checkPostgresPlan(t, d.DB, c.query, c.args)
				return
			}
			checkMySQLPlan(t, d.DB, c.query, c.args)
		})
	}
}

// checkMySQLPlan checks that EXPLAIN names idx_unpublished as the key, without a filesort.
func checkMySQLPlan(t *testing.T, db *sql.DB, query string, args []any) {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+query, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		if row["key"] != "idx_unpublished" || strings.Contains(row["Extra"], "filesort") {
			t.Fatalf("plan of %s: %v; want key idx_unpublished without a filesort", query, row)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// checkPostgresPlan checks that the plan scans idx_unpublished, sorts nothing and never
// touches the primary key. It checks a custom plan and the generic plan a prepared
// statement comes to.
func checkPostgresPlan(t *testing.T, db *sql.DB, query string, args []any) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		var out string
		if err := conn.QueryRowContext(ctx, "EXPLAIN (FORMAT JSON) "+query, args...).Scan(&out); err != nil {
			t.Fatalf("EXPLAIN %s: %v", query, err)
		}
		var plans []struct{ Plan planNode }
		if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
			t.Fatalf("EXPLAIN %s: %q: %v", query, out, err)
		}
		var nodes []string
		unpublished, bad := false, false
		var walk func(n planNode)
		walk = func(n planNode) {
			nodes = append(nodes, n.NodeType+" "+n.IndexName)
			unpublished = unpublished || n.IndexName == "idx_unpublished"
			bad = bad || n.NodeType == "Sort" || n.NodeType == "Seq Scan" || n.IndexName == "outbox_pkey"
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(plans[0].Plan)
		if !unpublished || bad {
			t.Fatalf("%s plan of %s: %v; want a scan of idx_unpublished, no sort, no primary key", mode, query, nodes)
		}
	}
}

type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	Plans     []planNode `json:"Plans"`
}

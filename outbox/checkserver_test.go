package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// ownPool opens the test database as a user of the library would, with sql.Open; params
// are the DSN's (tx_isolation...; on PostgreSQL the isolation given as tx_isolation is set
// as default_transaction_isolation), dbName replaces the database ("-": none, which a
// PostgreSQL session cannot be without).
func ownPool(t *testing.T, d testenv.Database, dbName string, params map[string]string) *sql.DB {
	t.Helper()
	if testenv.Dialect().IsPostgres() {
		if dbName == "-" {
			t.Fatal("a PostgreSQL session always has a database: there is no pool without one")
		}
		u, err := url.Parse(d.DSN)
		if err != nil {
			t.Fatal(err)
		}
		if iso, ok := params["tx_isolation"]; ok { // %20, not Encode's +: pgx takes + as it is
			u.RawQuery = "default_transaction_isolation=" + url.PathEscape(strings.ToLower(strings.ReplaceAll(strings.Trim(iso, "'"), "-", " ")))
		}
		db, err := sql.Open("pgx", u.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	mc, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	mc.Params = params
	if dbName == "-" {
		mc.DBName = ""
	}
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestRelayRefusesRepeatableRead: a relay on a pool of one's own left at REPEATABLE READ
// publishes nothing, in either mode: RelayOnce and CheckServer return an error wrapping
// dbx.ErrIsolation before any read or Kafka session, and Run returns it instead of retrying
// for ever. Under REPEATABLE READ the at-least-once relay's second read after lingering
// would see its first read's snapshot, and its locking reads take gap locks that block the
// business inserts.
func TestRelayRefusesRepeatableRead(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-rr", 1)
	ctx := context.Background()
	addCommitted(t, ctx, d.DB, newWriter(t), outbox.Event{ID: "rr-1", Type: "T", Topic: topic, Key: "k", Payload: []byte("x")})
	rr := ownPool(t, d, "", map[string]string{"tx_isolation": "'REPEATABLE-READ'"})
	p := &fakeProducer{}
	builds := []struct {
		name  string
		build func() *outbox.Relay
	}{
		{"at least once", func() *outbox.Relay { return newRelay(t, rr, p, outbox.RelayConfig{}) }},
		{"exactly once", func() *outbox.Relay { return newEOSRelay(t, rr, k, eosConfig(t, k, outbox.RelayConfig{})) }},
	}
	for _, b := range builds {
		t.Run(b.name, func(t *testing.T) {
			r := b.build()
			n, err := r.RelayOnce(ctx)
			if n != 0 || !errors.Is(err, dbx.ErrIsolation) || !strings.Contains(err.Error(), "REPEATABLE-READ") {
				t.Fatalf("RelayOnce = %d, %v; want 0 and a refusal (dbx.ErrIsolation) naming REPEATABLE-READ", n, err)
			}
			if err := r.CheckServer(ctx); !errors.Is(err, dbx.ErrIsolation) {
				t.Fatalf("CheckServer = %v; want dbx.ErrIsolation", err)
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := r.Run(rctx); !errors.Is(err, dbx.ErrIsolation) || rctx.Err() != nil {
				t.Fatalf("Run = %v (ctx %v); want dbx.ErrIsolation at once", err, rctx.Err())
			}
			if calls, _ := p.snapshot(); calls != 0 || r.Sessions() != 0 || pendingRows(t, d.DB) != 1 {
				t.Fatalf("a refused relay sent %d batches, started %d sessions, left %d rows pending (want 0, 0, 1)", calls, r.Sessions(), pendingRows(t, d.DB))
			}
		})
	}
	// The same database through a READ COMMITTED pool of one's own publishes.
	rc := ownPool(t, d, "", map[string]string{"tx_isolation": "'READ-COMMITTED'"})
	r := newRelay(t, rc, p, outbox.RelayConfig{})
	if n, err := r.RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RelayOnce at READ COMMITTED = %d, %v; want 1, nil", n, err)
	}
}

// TestEOSRelayDefaultTransactionalIDPerDatabase: two exactly-once relays of two databases,
// both with the default configuration, use two transactional ids, derived from their
// databases: neither fences the other, and each batch position carries its own id.
func TestEOSRelayDefaultTransactionalIDPerDatabase(t *testing.T) {
	ctx := context.Background()
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-eos-txnid", 1)
	positions := testenv.Topic(t, k, "relay-positions", 1)
	w := newWriter(t)
	type side struct {
		d testenv.Database
		r *outbox.Relay
	}
	var sides []side
	for range 2 {
		d := testenv.DB(t, 4)
		// Only the positions topic is the test's own (so parallel tests never share one);
		// the transactional id is left to the default.
		r := newEOSRelay(t, d.DB, k, outbox.RelayConfig{PositionsTopic: positions, LeaseTTL: 15 * time.Second})
		sides = append(sides, side{d, r})
	}
	var ids []string
	for round := range 2 { // a, b, a, b: a relay fenced by the other would fail its next batch
		for i, s := range sides {
			id := s.d.Name + "-" + string(rune('0'+round))
			ids = append(ids, id)
			addCommitted(t, ctx, s.d.DB, w, outbox.Event{ID: id, Type: "T", Topic: topic, Key: "k", Payload: []byte(id)})
			if n, err := s.r.RelayOnce(ctx); n != 1 || err != nil {
				t.Fatalf("round %d, relay %d: RelayOnce = %d, %v; want 1, nil", round, i, n, err)
			}
		}
	}
	for i, s := range sides {
		if want := "onceflow-relay-" + s.d.Name + "-default"; s.r.TransactionalID() != want {
			t.Errorf("relay %d: transactional id %q, want %q", i, s.r.TransactionalID(), want)
		}
		if s.r.Fencings() != 0 || s.r.Sessions() != 1 {
			t.Errorf("relay %d: fenced %d times, %d sessions; want 0, 1", i, s.r.Fencings(), s.r.Sessions())
		}
	}
	txnIDs := map[string]int{}
	for _, rec := range readAll(t, k, positions) {
		var p outbox.Position
		if err := json.Unmarshal(rec.Value, &p); err != nil {
			t.Fatalf("position %q: %v", rec.Value, err)
		}
		if p.Kind == "batch" {
			txnIDs[p.TxnID]++
		}
	}
	for _, s := range sides {
		if id := "onceflow-relay-" + s.d.Name + "-default"; txnIDs[id] != 2 {
			t.Errorf("batch positions by transactional id %v; want 2 under %s", txnIDs, id)
		}
	}
	assertExactlyOnce(t, readAll(t, k, topic), ids)
}

// TestEOSRelayDefaultTransactionalIDNeedsDatabase: a pool without a default database gives
// the exactly-once relay nothing to derive its id from: refused, unless an id is set.
func TestEOSRelayDefaultTransactionalIDNeedsDatabase(t *testing.T) {
	d := testenv.DB(t, 2)
	k := testenv.Kafka(t)
	ctx := context.Background()
	noDB := ownPool(t, d, "-", map[string]string{"tx_isolation": "'READ-COMMITTED'"})
	r := newEOSRelay(t, noDB, k, outbox.RelayConfig{PositionsTopic: "unused-positions"})
	if err := r.CheckServer(ctx); !errors.Is(err, outbox.ErrNoDatabase) {
		t.Fatalf("CheckServer = %v; want outbox.ErrNoDatabase", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Run(rctx); !errors.Is(err, outbox.ErrNoDatabase) || rctx.Err() != nil {
		t.Fatalf("Run = %v; want outbox.ErrNoDatabase at once", err)
	}
	set := newEOSRelay(t, noDB, k, outbox.RelayConfig{TransactionalID: "explicit", PositionsTopic: "unused-positions"})
	if err := set.CheckServer(ctx); err != nil || set.TransactionalID() != "explicit" {
		t.Fatalf("CheckServer with an explicit id = %v (id %q); want nil, explicit", err, set.TransactionalID())
	}
}

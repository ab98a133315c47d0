package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func validEvent() outbox.Event {
	return outbox.Event{ID: "0b9f3c4e-7d1a-4c2b-9e8f-1a2b3c4d5e6f", Type: "CouponGranted",
		Topic: "coupon.granted", Key: "order-1", Payload: []byte(`{"x":1}`)}
}

func TestEventValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*outbox.Event)
		ok     bool
	}{
		{"valid", func(*outbox.Event) {}, true},
		{"id 36 bytes", func(e *outbox.Event) { e.ID = strings.Repeat("a", 36) }, true},
		{"empty id", func(e *outbox.Event) { e.ID = "" }, false},
		{"id 37 bytes", func(e *outbox.Event) { e.ID = strings.Repeat("a", 37) }, false},
		{"empty type", func(e *outbox.Event) { e.Type = "" }, false},
		{"type 64 bytes", func(e *outbox.Event) { e.Type = strings.Repeat("t", 64) }, true},
		{"type 65 bytes", func(e *outbox.Event) { e.Type = strings.Repeat("t", 65) }, false},
		{"empty key", func(e *outbox.Event) { e.Key = "" }, false},
		{"key 191 bytes", func(e *outbox.Event) { e.Key = strings.Repeat("k", 191) }, true},
		{"key 192 bytes", func(e *outbox.Event) { e.Key = strings.Repeat("k", 192) }, false},
		{"topic with dots, dashes, underscores", func(e *outbox.Event) { e.Topic = "a.b-c_D9" }, true},
		{"topic 249 bytes", func(e *outbox.Event) { e.Topic = strings.Repeat("t", 249) }, true},
		{"empty topic", func(e *outbox.Event) { e.Topic = "" }, false},
		{"topic .", func(e *outbox.Event) { e.Topic = "." }, false},
		{"topic ..", func(e *outbox.Event) { e.Topic = ".." }, false},
		{"topic with space", func(e *outbox.Event) { e.Topic = "coupon granted" }, false},
		{"topic with slash", func(e *outbox.Event) { e.Topic = "coupon/granted" }, false},
		{"topic with non-ascii", func(e *outbox.Event) { e.Topic = "coupón" }, false},
		{"topic 250 bytes", func(e *outbox.Event) { e.Topic = strings.Repeat("t", 250) }, false},
		{"extra headers", func(e *outbox.Event) { e.Headers = map[string]string{"trace_id": "abc"} }, true},
		{"header shadows event_id", func(e *outbox.Event) { e.Headers = map[string]string{outbox.HeaderEventID: "forged"} }, false},
		{"header shadows event_type", func(e *outbox.Event) { e.Headers = map[string]string{outbox.HeaderEventType: "Forged"} }, false},
		{"bad trace parent", func(e *outbox.Event) { e.TraceParent = "00-abc" }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := validEvent()
			c.mutate(&e)
			err := e.Validate()
			if c.ok && err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
			if !c.ok && err == nil {
				t.Fatalf("Validate() = nil, want an error for %+v", e)
			}
			if !c.ok && !isInvalidEvent(err) {
				t.Fatalf("Validate() = %v, want an error that is ErrInvalidEvent and says it is permanent", err)
			}
		})
	}
}

func TestNewWriterTable(t *testing.T) {
	for _, table := range []string{"", "outbox", "outbox_v2", "_x"} {
		if _, err := outbox.NewWriter(table); err != nil {
			t.Errorf("NewWriter(%q) = %v, want nil", table, err)
		}
	}
	for _, table := range []string{"outbox; DROP TABLE inbox", "outbox; DROP", "out box", "db.outbox", "`outbox`", "1outbox", strings.Repeat("a", 65)} {
		if _, err := outbox.NewWriter(table); err == nil {
			t.Errorf("NewWriter(%q) = nil error, want a rejection", table)
		}
	}
}

func TestNewRelayConfig(t *testing.T) {
	// sql.Open does not connect, and the relay only needs a non-nil pool here.
	db, err := sql.Open("mysql", "u:p@tcp(127.0.0.1:1)/x")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := &fakeProducer{}
	cases := []struct {
		name string
		cfg  outbox.RelayConfig
		ok   bool
	}{
		{"defaults", outbox.RelayConfig{}, true},
		{"batch size 0 means default", outbox.RelayConfig{BatchSize: 0}, true},
		{"batch size 1", outbox.RelayConfig{BatchSize: 1}, true},
		{"batch size 10000", outbox.RelayConfig{BatchSize: 10000}, true},
		{"batch size -1", outbox.RelayConfig{BatchSize: -1}, false},
		{"batch size 10001", outbox.RelayConfig{BatchSize: 10001}, false},
		{"batch size 20000", outbox.RelayConfig{BatchSize: 20000}, false},
		{"table injection", outbox.RelayConfig{Table: "outbox; DROP"}, false},
		{"table with space", outbox.RelayConfig{Table: "out box"}, false},
		{"negative poll interval", outbox.RelayConfig{PollInterval: -time.Millisecond}, false},
		{"negative retry backoff", outbox.RelayConfig{RetryBackoff: -time.Second}, false},
		{"linger 5ms", outbox.RelayConfig{Linger: 5 * time.Millisecond}, true},
		{"no linger", outbox.RelayConfig{Linger: outbox.NoLinger}, true},
		{"negative linger: none", outbox.RelayConfig{Linger: -time.Millisecond}, true},
		{"linger above 10s", outbox.RelayConfig{Linger: 11 * time.Second, LeaseTTL: time.Minute}, false},
		{"linger half the lease ttl", outbox.RelayConfig{Linger: time.Second, LeaseTTL: 2 * time.Second}, false},
		{"shards 1", outbox.RelayConfig{Shards: 1}, true},
		{"shards 2 need the exactly-once relay", outbox.RelayConfig{Shards: 2}, false},
		{"negative shards", outbox.RelayConfig{Shards: -1}, false},
		{"shard name with #", outbox.RelayConfig{Shard: "a#1"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := outbox.NewRelay(db, p, c.cfg, nil)
			if c.ok && (err != nil || r == nil) {
				t.Fatalf("NewRelay(%+v) = %v, %v; want a relay", c.cfg, r, err)
			}
			if !c.ok && err == nil {
				t.Fatalf("NewRelay(%+v) accepted an invalid config", c.cfg)
			}
		})
	}
	if _, err := outbox.NewRelay(nil, p, outbox.RelayConfig{}, nil); err == nil {
		t.Error("NewRelay without db: want an error")
	}
	if _, err := outbox.NewRelay(db, nil, outbox.RelayConfig{}, nil); err == nil {
		t.Error("NewRelay without producer: want an error")
	}
}

func TestWriterAddValidates(t *testing.T) {
	// Validation runs before the transaction is touched, so a nil tx is never used.
	e := validEvent()
	e.ID = "points-" + strings.Repeat("o", 64) // a 64-byte key in an id: 71 bytes
	err := newWriter(t).Add(context.Background(), nil, e)
	if err == nil || !strings.Contains(err.Error(), "is 71 bytes, must be 1..36") || !strings.Contains(err.Error(), "outbox.EventID") {
		t.Fatalf("Add of a 71-byte event id: %v, want its length, the limit and the helper named", err)
	}
	// A handler wraps it, and the wrapped error still says that no retry can fix it.
	if wrapped := fmt.Errorf("credit order: %w", err); !isInvalidEvent(wrapped) {
		t.Fatalf("Add's error, wrapped: %v, want ErrInvalidEvent and permanent", wrapped)
	}
	if err := newWriter(t).AddBatch(context.Background(), nil, []outbox.Event{validEvent(), e}); !isInvalidEvent(err) {
		t.Fatalf("AddBatch with an invalid event: %v, want ErrInvalidEvent and permanent", err)
	}
}

// isInvalidEvent reports whether err is outbox.ErrInvalidEvent and has a Permanent method
// that says true, as an error classifier outside outbox finds it.
func isInvalidEvent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.Is(err, outbox.ErrInvalidEvent) && errors.As(err, &p) && p.Permanent()
}

func TestWriterAddDuplicateEvent(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	w := newWriter(t)
	e := validEvent()
	addCommitted(t, ctx, d.DB, w, e)

	// Same id in a later transaction, even with a different body.
	e2 := e
	e2.Key, e2.Payload = "order-2", []byte("other")
	err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error { return w.Add(ctx, tx, e2) })
	if !errors.Is(err, outbox.ErrDuplicateEvent) {
		t.Fatalf("second Add of %s: %v, want ErrDuplicateEvent", e.ID, err)
	}
	// Same id twice in one transaction.
	e3 := validEvent()
	e3.ID = "dup-in-one-tx"
	err = dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		if err := w.Add(ctx, tx, e3); err != nil {
			return err
		}
		return w.Add(ctx, tx, e3)
	})
	if !errors.Is(err, outbox.ErrDuplicateEvent) {
		t.Fatalf("Add twice in one tx: %v, want ErrDuplicateEvent", err)
	}
	if n := countRows(t, d.DB, "1=1"); n != 1 {
		t.Fatalf("outbox holds %d rows, want 1 (the first event only)", n)
	}
}

func TestWriterAddRollsBackWithCaller(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	w := newWriter(t)
	boom := errors.New("business change failed")
	err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		if err := w.Add(ctx, tx, validEvent()); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v", err)
	}
	if n := countRows(t, d.DB, "1=1"); n != 0 {
		t.Fatalf("outbox holds %d rows after rollback, want 0", n)
	}
}

func TestWriterAddStoresFields(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	w := newWriter(t)
	withHeaders := validEvent()
	withHeaders.Headers = map[string]string{"trace_id": "t-1", "tenant": "acme"}
	empty := validEvent()
	empty.ID, empty.Payload = "empty-payload", nil
	addCommitted(t, ctx, d.DB, w, withHeaders, empty)

	var (
		typ, topic, key string
		payload         []byte
		headers         sql.NullString
		published       sql.NullTime
	)
	err := d.DB.QueryRow(rebind(d.DB, "SELECT event_type, topic, msg_key, payload, headers, published_at FROM outbox WHERE event_id = ?"), withHeaders.ID).
		Scan(&typ, &topic, &key, &payload, &headers, &published)
	if err != nil {
		t.Fatal(err)
	}
	if typ != withHeaders.Type || topic != withHeaders.Topic || key != withHeaders.Key || string(payload) != string(withHeaders.Payload) {
		t.Fatalf("stored row %q %q %q %q differs from %+v", typ, topic, key, payload, withHeaders)
	}
	if !headers.Valid || !strings.Contains(headers.String, `"trace_id":"t-1"`) {
		t.Fatalf("stored headers %+v", headers)
	}
	if published.Valid {
		t.Fatal("a new row must be unpublished")
	}
	if err := d.DB.QueryRow(rebind(d.DB, "SELECT headers FROM outbox WHERE event_id = ?"), empty.ID).Scan(&headers); err != nil {
		t.Fatal(err)
	}
	if headers.Valid {
		t.Fatalf("an event without extra headers stores NULL headers, got %q", headers.String)
	}
}

// TestWriterUseStatementsTakesTheDialect checks that a Writer given its pool with
// UseStatements writes that pool's SQL without WithDialect, such as PostgreSQL's
// placeholders. It does so one event at a time and in multi-row batches, which run
// interpolated until their statements are prepared. Event ids come back as they were
// written, where PostgreSQL would pad a CHAR(36).
func TestWriterUseStatementsTakesTheDialect(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	w, err := outbox.NewWriter("")
	if err != nil {
		t.Fatal(err)
	}
	w.UseStatements(d.DB)
	t.Cleanup(func() { _ = w.Close() })
	one := validEvent()
	one.ID = "one"
	addCommitted(t, ctx, d.DB, w, one)
	for round := range 3 { // the statements are prepared in the background after the first
		var evs []outbox.Event
		for i := range 600 {
			evs = append(evs, outbox.Event{ID: fmt.Sprintf("b%d-%03d", round, i), Type: "T", Topic: "t", Key: "k", Payload: []byte{byte(i)}})
		}
		if err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error { return w.AddBatch(ctx, tx, evs) }); err != nil {
			t.Fatalf("AddBatch, round %d: %v", round, err)
		}
	}
	if n := countRows(t, d.DB, "1=1"); n != 1+3*600 {
		t.Fatalf("outbox holds %d rows, want %d", n, 1+3*600)
	}
	var got string
	if err := d.DB.QueryRow("SELECT event_id FROM outbox ORDER BY id LIMIT 1").Scan(&got); err != nil || got != "one" {
		t.Fatalf("first event id %q, %v; want %q", got, err, "one")
	}
}

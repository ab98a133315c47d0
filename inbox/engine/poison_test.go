package engine_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
)

// poisonCase is one outside record that must end quarantined instead of looping. A good
// order with odd transport fields must end granted.
type poisonCase struct {
	name    string
	msg     func() *message.Message
	want    engine.Outcome
	reason  engine.Reason
	handler func(g inbox.Handler) inbox.Handler // nil: the coupon granter itself
}

func poisonCases() []poisonCase {
	good := func(id string) *message.Message { return orderMsg(id, "u-"+id) }
	return []poisonCase{
		{name: "tombstone", want: engine.OutcomeQuarantined, reason: engine.ReasonPoison,
			msg: func() *message.Message { return message.NewMessage(watermill.NewUUID(), nil) }},
		{name: "empty value", want: engine.OutcomeQuarantined, reason: engine.ReasonPoison,
			msg: func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte{}) }},
		{name: "invalid UTF-8 in the value", want: engine.OutcomeQuarantined, reason: engine.ReasonPoison,
			msg: func() *message.Message {
				return message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"p-utf8","userId":"u","amountCents":"`+"\xff\xfe"+`"}`))
			}},
		{name: "2 MiB value", want: engine.OutcomeQuarantined, reason: engine.ReasonPoison,
			msg: func() *message.Message {
				return message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"p-big","userId":"u","x":"`+strings.Repeat("é", 1<<20)+`"}`))
			}},
		{name: "70 KiB of headers", want: engine.OutcomeQuarantined, reason: engine.ReasonPoison,
			msg: func() *message.Message {
				m := good("p-headers")
				for i := range 7 {
					m.Metadata.Set(fmt.Sprintf("h%d", i), strings.Repeat("ü", 5<<10))
				}
				return m
			}},
		{name: "invalid UTF-8 in a header", want: engine.OutcomeProcessed,
			msg: func() *message.Message {
				m := good("p-header-utf8")
				m.Metadata.Set("trace\xff", "v\xfe\xfd")
				return m
			}},
		{name: "message id not UTF-8", want: engine.OutcomeProcessed,
			msg: func() *message.Message { m := good("p-uuid-utf8"); m.UUID = "\xff\xfeid\xc3"; return m }},
		{name: "message id cut mid-character", want: engine.OutcomeProcessed,
			msg: func() *message.Message { m := good("p-uuid-long"); m.UUID = "x" + strings.Repeat("é", 40); return m }},
		{name: "error text cut mid-character", want: engine.OutcomeQuarantined, reason: engine.ReasonPermanent,
			msg: func() *message.Message { return good("p-errtext") },
			handler: func(g inbox.Handler) inbox.Handler {
				return handlerFunc{inner: g, handle: func(context.Context, *sql.Tx, *inbox.Delivery) (inbox.Progress, error) {
					return inbox.Done, inbox.Permanent(errors.New("x" + strings.Repeat("é", 2500) + "\xff"))
				}}
			}},
		{name: "panicking handler", want: engine.OutcomeQuarantined, reason: engine.ReasonPanic,
			msg: func() *message.Message { return good("p-panic") },
			handler: func(g inbox.Handler) inbox.Handler {
				return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
					// The write is under way when it panics, and its row lock must not outlive
					// it.
					if _, err := tx.ExecContext(ctx, "UPDATE coupon_stock SET locked = locked WHERE campaign_id IS NOT NULL"); err != nil {
						return inbox.Done, err
					}
					panic("plugin bug on " + d.Key)
				}}
			}},
		{name: "panicking decoder", want: engine.OutcomeQuarantined, reason: engine.ReasonPanic,
			msg: func() *message.Message { return good("p-decode-panic") },
			handler: func(g inbox.Handler) inbox.Handler {
				return decodeFunc{Handler: g, decode: func(*message.Message) (inbox.Decoded, error) { panic("decoder bug") }}
			}},
		{name: "blocking handler", want: engine.OutcomeQuarantined, reason: engine.ReasonTimeout,
			msg: func() *message.Message { return good("p-block") },
			handler: func(g inbox.Handler) inbox.Handler {
				return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
					if _, err := tx.ExecContext(ctx, "UPDATE coupon_stock SET locked = locked WHERE campaign_id IS NOT NULL"); err != nil {
						return inbox.Done, err
					}
					select {} // ignores its context: the inbox must give up on it
				}}
			}},
		{name: "fingerprint not UTF-8", want: engine.OutcomeProcessed,
			msg: func() *message.Message { return good("p-fp-utf8") },
			handler: func(g inbox.Handler) inbox.Handler {
				return decodeFunc{Handler: g, decode: func(m *message.Message) (inbox.Decoded, error) {
					d, err := g.Decode(m)
					d.Fingerprint = "\xff\xfe"
					return d, err
				}}
			}},
	}
}

// decodeFunc replaces a handler's Decode.
type decodeFunc struct {
	inbox.Handler
	decode func(*message.Message) (inbox.Decoded, error)
}

func (h decodeFunc) Decode(m *message.Message) (inbox.Decoded, error) { return h.decode(m) }

func openTransactions(t *testing.T, p *pipeline) int { return testenv.OpenTransactions(t, p.db.Name) }

// TestPoisonNeverLoops checks that every poison variant ends in one Process call with a
// recorded outcome, never in an error loop. Good orders around it are granted once. The
// test runs on both paths, one delivery per transaction and the group-commit Batcher.
func TestPoisonNeverLoops(t *testing.T) {
	for _, batched := range []bool{false, true} {
		for _, tc := range poisonCases() {
			name := tc.name
			if batched {
				// The wrapped handlers are plain Handlers. They are group-committed, each
				// delivery behind a savepoint. The granter itself is a BatchHandler.
				name = "batch/" + name
			}
			t.Run(name, func(t *testing.T) {
				p := newPipeline(t, pipelineOpts{conns: 8, wrap: tc.handler, inboxCfg: engine.Config{MaxAttempts: 2, HandlerTimeout: 300 * time.Millisecond}})
				process := func(ctx context.Context, m *message.Message, src inbox.Source) (engine.Result, error) {
					return p.inbox.Process(ctx, m, src, engine.ProcessOptions{})
				}
				if batched {
					b, err := p.inbox.NewBatcher(engine.BatchConfig{})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { b.Close() })
					process = b.Process
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				before, after := orderMsg("good-before", "u1"), orderMsg("good-after", "u2")
				if tc.handler == nil {
					if r, err := process(ctx, before, inbox.Source{Topic: "order-paid", Offset: 1}); err != nil || r.Outcome != engine.OutcomeProcessed {
						t.Fatalf("good order before: %+v %v", r, err)
					}
				}
				m := tc.msg()
				src := inbox.Source{Topic: "order-paid", Partition: 3, Offset: 2}
				r, err := process(ctx, m, src)
				if err != nil {
					t.Fatalf("Process returned an error (the message would be redelivered forever): %v", err)
				}
				if r.Outcome != tc.want || (tc.reason != "" && r.Reason != tc.reason) {
					t.Fatalf("outcome %s/%s, want %s/%s (err %v)", r.Outcome, r.Reason, tc.want, tc.reason, r.Err)
				}
				if tc.handler == nil {
					if r, err := process(ctx, after, inbox.Source{Topic: "order-paid", Offset: 3}); err != nil || r.Outcome != engine.OutcomeProcessed {
						t.Fatalf("good order after: %+v %v", r, err)
					}
				}
				var status, lastErr, meta sql.NullString
				var payloadLen int
				if err := p.db.DB.QueryRow(testenv.Rebind("SELECT status, last_error, metadata, LENGTH(payload) FROM inbox WHERE id = ?"), r.InboxID).Scan(&status, &lastErr, &meta, &payloadLen); err != nil {
					t.Fatalf("inbox row %d: %v", r.InboxID, err)
				}
				wantStatus := "done"
				if tc.want == engine.OutcomeQuarantined {
					wantStatus = "failed"
				}
				if status.String != wantStatus {
					t.Fatalf("row status %q, want %q", status.String, wantStatus)
				}
				if !utf8.ValidString(lastErr.String) || !utf8.ValidString(meta.String) {
					t.Fatalf("stored text is not UTF-8: last_error %q metadata %.80q", lastErr.String, meta.String)
				}
				switch tc.reason {
				case engine.ReasonPanic:
					if !strings.Contains(lastErr.String, "panic") || !strings.Contains(lastErr.String, "goroutine") {
						t.Fatalf("last_error should hold the panic and its stack: %.300q", lastErr.String)
					}
				case engine.ReasonTimeout:
					if !strings.Contains(lastErr.String, "handler_timeout") {
						t.Fatalf("last_error should name the timeout: %q", lastErr.String)
					}
				}
				if len(m.Payload) > 1<<20 && payloadLen >= len(m.Payload) {
					t.Fatalf("an oversized payload of %d bytes was stored whole (%d)", len(m.Payload), payloadLen)
				}
				// No transaction, and so no row lock, outlives the delivery.
				deadline := time.Now().Add(10 * time.Second)
				for openTransactions(t, p) > 0 {
					if time.Now().After(deadline) {
						t.Fatalf("%d transactions still open after the delivery ended", openTransactions(t, p))
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		}
	}
}

// TestQuarantineStoresBoundedContent checks the stored form of the odd inputs. A tombstone
// is flagged. An oversized payload keeps a prefix with its size and sha256. Capped metadata
// is valid JSON with a marker.
func TestQuarantineStoresBoundedContent(t *testing.T) {
	p := newPipeline(t, pipelineOpts{conns: 4})
	ctx := context.Background()
	store, err := inboxops.NewStore(p.db.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	row := func(r engine.Result) inboxops.Row {
		t.Helper()
		rows, err := store.List(ctx, inboxops.Filter{Refs: []string{fmt.Sprint(r.InboxID)}})
		if err != nil || len(rows) != 1 {
			t.Fatalf("row %d: %v %v", r.InboxID, rows, err)
		}
		return rows[0]
	}
	r, err := p.inbox.Process(ctx, message.NewMessage("tomb", nil), inbox.Source{Topic: "order-paid", Offset: 7}, engine.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr := row(r); !tr.Tombstone || tr.Message().Payload != nil || tr.Truncated() {
		t.Fatalf("tombstone row: tombstone=%v payload=%v truncated=%v", tr.Tombstone, tr.Message().Payload, tr.Truncated())
	}
	big := []byte(strings.Repeat("x", 2<<20))
	r, err = p.inbox.Process(ctx, message.NewMessage("big", big), inbox.Source{Topic: "order-paid", Offset: 8}, engine.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	br := row(r)
	if !br.Truncated() || br.PayloadSize != int64(len(big)) || len(br.Payload) >= len(big) || br.Fingerprint != sha256hex(big) {
		t.Fatalf("oversized row: truncated=%v size=%d stored=%d fingerprint=%s", br.Truncated(), br.PayloadSize, len(br.Payload), br.Fingerprint)
	}
	m := message.NewMessage("hdr", []byte("{"))
	m.Metadata.Set("huge", strings.Repeat("h", 100<<10))
	m.Metadata.Set("small", "kept")
	r, err = p.inbox.Process(ctx, m, inbox.Source{Topic: "order-paid", Offset: 9}, engine.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hr := row(r)
	if hr.Metadata["small"] != "kept" || hr.Metadata["huge"] != "" || hr.Metadata[engine.MetadataTruncatedKey] == "" {
		t.Fatalf("capped metadata: %.200v", hr.Metadata)
	}
}

// TestQuarantineFallsBackToMinimalRow checks that a database that refuses the quarantine
// row as it is still gets a minimal one, with the key, source, reason and hash. A trigger
// that rejects failed rows carrying a payload shows it.
func TestQuarantineFallsBackToMinimalRow(t *testing.T) {
	p := newPipeline(t, pipelineOpts{conns: 4})
	p.db.RefuseQuarantinePayloads(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	payload := []byte(`{"not":"an order"}`)
	r, err := p.inbox.Process(ctx, message.NewMessage("x", payload), inbox.Source{Topic: "order-paid", Partition: 1, Offset: 42}, engine.ProcessOptions{})
	if err != nil {
		t.Fatalf("the quarantine had no fallback: %v", err)
	}
	var key, fp, lastErr string
	var size sql.NullInt64
	if err := p.db.DB.QueryRow(testenv.Rebind("SELECT dedup_key, fingerprint, last_error, payload_size FROM inbox WHERE id = ?"), r.InboxID).Scan(&key, &fp, &lastErr, &size); err != nil {
		t.Fatal(err)
	}
	if key != "poison:order-paid/1/42" || fp != sha256hex(payload) || size.Int64 != int64(len(payload)) || !strings.Contains(lastErr, "payload refused") {
		t.Fatalf("minimal row: key %q fp %s size %v last_error %q", key, fp, size, lastErr)
	}
}

// TestShortFingerprintConflict checks that a plugin whose fingerprints are short or not
// UTF-8 cannot crash the framework's conflict path. The same key with another fingerprint
// is quarantined as a conflict.
func TestShortFingerprintConflict(t *testing.T) {
	var fp atomic.Value
	fp.Store("ab")
	p := newPipeline(t, pipelineOpts{wrap: func(g inbox.Handler) inbox.Handler {
		return decodeFunc{Handler: g, decode: func(m *message.Message) (inbox.Decoded, error) {
			d, err := g.Decode(m)
			d.Fingerprint = fp.Load().(string)
			return d, err
		}}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r, err := p.inbox.Process(ctx, orderMsg("fp-1", "u"), src, engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeProcessed {
		t.Fatalf("first: %+v %v", r, err)
	}
	for _, f := range []string{"cd", "\xff"} {
		fp.Store(f)
		r, err := p.inbox.Process(ctx, orderMsg("fp-1", "u"), src, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeConflict {
			t.Fatalf("fingerprint %q: %+v %v", f, r, err)
		}
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'fp-1'"); n != 1 {
		t.Fatalf("coupons %d, want 1", n)
	}
}

// TestPanicsLeaveNoOpenTransaction checks that a panicking handler's transaction is rolled
// back and its connection returned. After many panics the pool has no connection in use,
// and every other order is granted.
func TestPanicsLeaveNoOpenTransaction(t *testing.T) {
	var panics atomic.Int64
	p := newPipeline(t, pipelineOpts{conns: 4, inboxCfg: engine.Config{MaxAttempts: 3}, wrap: func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if strings.HasPrefix(d.Key, "bad-") {
				if _, err := tx.ExecContext(ctx, "UPDATE coupon_stock SET locked = locked"); err != nil {
					return inbox.Done, err
				}
				panics.Add(1)
				panic(fmt.Sprintf("bad order %s", d.Key))
			}
			return g.Handle(ctx, tx, d)
		}}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 20 {
		id := fmt.Sprintf("ok-%d", i)
		if i%2 == 1 {
			id = fmt.Sprintf("bad-%d", i)
		}
		r, err := p.inbox.Process(ctx, orderMsg(id, "u"), inbox.Source{Topic: "order-paid", Offset: int64(i)}, engine.ProcessOptions{})
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		want := engine.OutcomeProcessed
		if i%2 == 1 {
			want = engine.OutcomeQuarantined
		}
		if r.Outcome != want {
			t.Fatalf("%s: outcome %s (%s), want %s", id, r.Outcome, r.Reason, want)
		}
	}
	if panics.Load() != 30 {
		t.Fatalf("%d panics, want 30 (10 orders x 3 attempts)", panics.Load())
	}
	if st := p.db.DB.Stats(); st.InUse != 0 {
		t.Fatalf("%d connections still in use", st.InUse)
	}
	if n := openTransactions(t, p); n != 0 {
		t.Fatalf("%d transactions open", n)
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason = 'panic'"); n != 10 {
		t.Fatalf("%d rows quarantined with reason panic, want 10", n)
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon"); n != 10 {
		t.Fatalf("%d coupons, want 10", n)
	}
	_ = coupon.BizType
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// badBatch is the plugin's handler with a HandleBatch and a Handle that misbehave on keys
// "bad-*".
type badBatch struct {
	inbox.BatchHandler
	misbehave func(ctx context.Context)
}

func (b badBatch) HandleBatch(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	for _, d := range ds {
		if strings.HasPrefix(d.Key, "bad-") {
			b.misbehave(ctx)
		}
	}
	return b.BatchHandler.HandleBatch(ctx, tx, ds)
}

func (b badBatch) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if strings.HasPrefix(d.Key, "bad-") {
		b.misbehave(ctx)
	}
	return b.BatchHandler.Handle(ctx, tx, d)
}

// TestBatchPanicsAndTimeouts checks that on the group-commit path a panicking or blocking
// HandleBatch rolls its batch back. Every delivery then runs on its own. The good ones are
// granted and the bad ones quarantined.
func TestBatchPanicsAndTimeouts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		misbehave func(ctx context.Context)
		reason    engine.Reason
	}{
		{"panic", func(context.Context) { panic("batch plugin bug") }, engine.ReasonPanic},
		{"block", func(context.Context) { select {} }, engine.ReasonTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(t, pipelineOpts{conns: 8, inboxCfg: engine.Config{MaxAttempts: 2, HandlerTimeout: 300 * time.Millisecond}, plugin: true,
				wrap: func(h inbox.Handler) inbox.Handler {
					return badBatch{BatchHandler: h.(inbox.BatchHandler), misbehave: tc.misbehave}
				}})
			b, err := p.inbox.NewBatcher(engine.BatchConfig{Linger: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			results := make(chan engine.Result, 20)
			for i := range 20 {
				id := fmt.Sprintf("ok-%d", i)
				if i%5 == 0 {
					id = fmt.Sprintf("bad-%d", i)
				}
				go func() {
					r, err := b.Process(ctx, orderMsg(id, "u"), inbox.Source{Topic: "order-paid", Offset: int64(i)})
					if err != nil {
						t.Errorf("%s: %v", id, err)
					}
					results <- r
				}()
			}
			outcomes := map[string]int{}
			for range 20 {
				r := <-results
				outcomes[fmt.Sprintf("%s/%s/%v", r.Outcome, r.Reason, strings.HasPrefix(r.Key, "bad-"))]++
			}
			want := map[string]int{"processed//false": 16, fmt.Sprintf("quarantined/%s/true", tc.reason): 4}
			if fmt.Sprint(outcomes) != fmt.Sprint(want) {
				t.Fatalf("outcomes %v, want %v (batch stats %+v)", outcomes, want, b.Stats())
			}
			if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon"); n != 16 {
				t.Fatalf("%d coupons, want 16", n)
			}
			if n := openTransactions(t, p); n != 0 {
				t.Fatalf("%d transactions open", n)
			}
		})
	}
}

// TestAttemptsCountAcrossProcesses checks that attempts are bounded across processes. A
// record that keeps failing is quarantined after inbox.max_attempts in all. That holds even
// when each process running it is stopped before its own count runs out, killed or its
// partition lost. Process A fails twice and stops. The redelivery to process B fails once
// more and is quarantined, after three attempts, not five.
func TestAttemptsCountAcrossProcesses(t *testing.T) {
	var calls atomic.Int64
	stopAfter := make(chan struct{})
	wrap := func(g inbox.Handler) inbox.Handler {
		return handlerFunc{inner: g, handle: func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
			if calls.Add(1) == 2 {
				close(stopAfter)
			}
			return inbox.Done, errors.New("downstream keeps failing")
		}}
	}
	a := newPipeline(t, pipelineOpts{conns: 4, inboxCfg: engine.Config{MaxAttempts: 3, BackoffInitial: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, wrap: wrap})
	b := newPipeline(t, pipelineOpts{shared: &a.db, inboxCfg: engine.Config{MaxAttempts: 3}, wrap: wrap})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // A stops once its second attempt is counted, during its backoff
		<-stopAfter
		q := testenv.Rebind("SELECT attempts FROM inbox WHERE dedup_key = ?")
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			var n int
			if err := a.db.DB.QueryRow(q, "o-flaky").Scan(&n); err == nil && n >= 2 {
				break
			}
		}
		cancel()
	}()
	if _, err := a.inbox.Process(ctx, orderMsg("o-flaky", "u"), src, engine.ProcessOptions{}); err == nil {
		t.Fatal("process A was stopped: its delivery must not be acked")
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("process A ran %d attempts before it stopped, want 2", n)
	}
	r, err := b.inbox.Process(context.Background(), orderMsg("o-flaky", "u"), src, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeQuarantined || r.Attempts != 3 {
		t.Fatalf("process B: %+v %v, want quarantined after 3 attempts in all", r, err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d attempts in all, want 3 (inbox.max_attempts)", n)
	}
}

// badPrepare is the plugin's handler, its HandleBatch included, with a Prepare that
// misbehaves on the first call for each key "bad-*".
type badPrepare struct {
	inbox.BatchHandler
	misbehave func(ctx context.Context)
	mu        sync.Mutex
	seen      map[string]bool
}

func (b *badPrepare) Prepare(ctx context.Context, d *inbox.Delivery) error {
	b.mu.Lock()
	first := !b.seen[d.Key]
	b.seen[d.Key] = true
	b.mu.Unlock()
	if first && strings.HasPrefix(d.Key, "bad-") {
		b.misbehave(ctx)
	}
	if p, ok := b.BatchHandler.(inbox.Preparer); ok {
		return p.Prepare(ctx, d)
	}
	return nil
}

// TestBatchPreparePanicsAndTimeouts checks that a Prepare that panics or times out under
// group commit fails only its own delivery's attempt. That delivery is retried alone,
// where its next Prepare is sound, and granted. The others are batched meanwhile. A
// Prepare that never returns, not even once its context is cancelled, may still be calling
// out. Its key's next call would overlap it. So its delivery's attempts time out waiting
// for it, and the delivery is quarantined with reason timeout.
func TestBatchPreparePanicsAndTimeouts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		misbehave func(ctx context.Context)
		stuck     bool // the bad keys' first call never returns
	}{
		{"panic", func(context.Context) { panic("prepare bug") }, false},
		{"block until cancelled", func(ctx context.Context) { <-ctx.Done() }, false},
		{"block for good", func(context.Context) { select {} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(t, pipelineOpts{conns: 8, inboxCfg: engine.Config{HandlerTimeout: 300 * time.Millisecond, BackoffInitial: time.Millisecond, BackoffMax: 10 * time.Millisecond}, plugin: true,
				wrap: func(h inbox.Handler) inbox.Handler {
					return &badPrepare{BatchHandler: h.(inbox.BatchHandler), misbehave: tc.misbehave, seen: map[string]bool{}}
				}})
			b, err := p.inbox.NewBatcher(engine.BatchConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ids := make([]string, 20)
			for i := range ids {
				ids[i] = fmt.Sprintf("ok-%02d", i)
				if i%5 == 0 {
					ids[i] = fmt.Sprintf("bad-%02d", i)
				}
			}
			res := submit(t, b, ids, 0)
			for range ids {
				r := <-res
				want, reason := engine.OutcomeProcessed, engine.Reason("")
				if tc.stuck && strings.HasPrefix(r.Key, "bad-") {
					want, reason = engine.OutcomeQuarantined, engine.ReasonTimeout
				}
				if r.Outcome != want || r.Reason != reason {
					t.Fatalf("%s: %s (%s), want %s (%s)", r.Key, r.Outcome, r.Reason, want, reason)
				}
			}
			if st := b.Stats(); st.PrepareFailed != 4 || st.Prepared != 16 || st.Batched < 16 {
				t.Fatalf("stats %+v: want 4 failed prepares, 16 prepared and batched", st)
			}
			want := 20
			if tc.stuck {
				want = 16
			}
			if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon"); n != want {
				t.Fatalf("%d coupons, want %d", n, want)
			}
		})
	}
}

// TestPoisonRedeliveredAfterResolveIsADuplicate checks a poison record whose row an
// operator resolved, so the row is done. Delivered again, the record is a counted
// duplicate, not a second quarantine, and the row stays done.
func TestPoisonRedeliveredAfterResolveIsADuplicate(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	ctx := context.Background()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{not json`))
	src := inbox.Source{Topic: "order-paid", Partition: 2, Offset: 41}
	r, err := p.inbox.Process(ctx, msg, src, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeQuarantined {
		t.Fatalf("%+v, %v: want quarantined", r, err)
	}
	if _, err := p.db.DB.Exec(testenv.Rebind(`UPDATE inbox SET status = 'done', reason = 'resolved' WHERE id = ?`), r.InboxID); err != nil {
		t.Fatal(err)
	}
	r, err = p.inbox.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte(`{not json`)), src, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeDuplicate {
		t.Fatalf("%+v, %v: want duplicate", r, err)
	}
	var status string
	var dups int
	if err := p.db.DB.QueryRow(testenv.Rebind(`SELECT status, duplicates FROM inbox WHERE id = ?`), r.InboxID).Scan(&status, &dups); err != nil || status != "done" || dups != 1 {
		t.Fatalf("row %s with %d duplicates (%v), want done with 1", status, dups, err)
	}
}

package engine_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// provider is a real HTTP downstream, as a payment provider a refunds plugin calls. It
// counts each key's calls and its successful ones. It counts calls made after a success of
// the key, and calls that started while another call of the key was still running.
type provider struct {
	srv   *httptest.Server
	down  atomic.Bool // answers 503
	delay time.Duration

	mu           sync.Mutex
	inFlight     map[string]int
	calls, ok    map[string]int
	afterSuccess []string
	overlapping  []string
}

func newProvider(t *testing.T, delay time.Duration) *provider {
	p := &provider{delay: delay, inFlight: map[string]int{}, calls: map[string]int{}, ok: map[string]int{}}
	p.srv = httptest.NewServer(p)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls[key]++
	if p.inFlight[key] > 0 {
		p.overlapping = append(p.overlapping, key)
	}
	if p.ok[key] > 0 {
		p.afterSuccess = append(p.afterSuccess, key)
	}
	p.inFlight[key]++
	p.mu.Unlock()
	if p.delay > 0 {
		select {
		case <-time.After(p.delay):
		case <-r.Context().Done():
		}
	}
	down := p.down.Load()
	p.mu.Lock()
	p.inFlight[key]--
	if !down {
		p.ok[key]++
	}
	p.mu.Unlock()
	if down {
		http.Error(w, "provider down", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// check fails t unless every key in keys had exactly one successful call, none after it and
// none overlapping another.
func (p *provider) check(t *testing.T, keys ...string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range keys {
		if p.ok[k] != 1 {
			t.Errorf("key %s: %d successful calls of %d, want 1", k, p.ok[k], p.calls[k])
		}
	}
	if len(p.afterSuccess) > 0 || len(p.overlapping) > 0 {
		t.Errorf("calls after a success: %v; overlapping calls: %v", p.afterSuccess, p.overlapping)
	}
}

// refunds is a plugin as a new user writes it. Prepare calls the provider with the key as
// its idempotency key and reads nothing first. Handle records the refund.
type refunds struct {
	url    string
	client *http.Client

	mu        sync.Mutex
	failFirst map[string]bool // keys whose first Handle fails (after its calls were made)
}

var (
	_ inbox.Handler  = (*refunds)(nil)
	_ inbox.Preparer = (*refunds)(nil)
)

func (h *refunds) Decode(msg *message.Message) (inbox.Decoded, error) {
	var v struct {
		OrderID string `json:"orderId"`
	}
	if err := json.Unmarshal(msg.Payload, &v); err != nil {
		return inbox.Decoded{}, err
	}
	return inbox.Decoded{Key: v.OrderID, Value: v.OrderID}, nil
}

func (h *refunds) Prepare(ctx context.Context, d *inbox.Delivery) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, strings.NewReader("{}"))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", d.Key)
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("provider answered %s", resp.Status)
	}
	d.Prepared = true
	return nil
}

func (h *refunds) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if d.Prepared != true {
		return inbox.Continue, errors.New("refund not prepared")
	}
	h.mu.Lock()
	fail := h.failFirst[d.Key]
	delete(h.failFirst, d.Key)
	h.mu.Unlock()
	if fail {
		return inbox.Continue, errors.New("the refund table is busy")
	}
	_, err := tx.ExecContext(ctx, testenv.Rebind(`INSERT INTO refund (order_id) VALUES (?)`), d.Key)
	return inbox.Done, err
}

// refundsDB is a database with the refund table.
func refundsDB(t *testing.T) testenv.Database {
	d := testenv.DB(t, 24)
	d.AdminExec(t, `CREATE TABLE refund (order_id VARCHAR(191) PRIMARY KEY)`)
	return d
}

// refundInbox is one router's inbox of the refunds plugin on d. The first Handle of each
// key in failFirst fails.
func refundInbox(t *testing.T, d testenv.Database, p *provider, failFirst ...string) *engine.Inbox {
	t.Helper()
	h := &refunds{url: p.srv.URL + "/refund", client: &http.Client{Timeout: 10 * time.Second}, failFirst: map[string]bool{}}
	for _, k := range failFirst {
		h.failFirst[k] = true
	}
	ib, err := engine.New(d.DB, h, engine.Config{BizType: "refund", MaxAttempts: 2, BackoffInitial: time.Millisecond, BackoffMax: 10 * time.Millisecond,
		DelayedRetries: 5, DelayedBackoff: 10 * time.Millisecond, DelayedBackoffMax: 10 * time.Millisecond, BreakerOff: true,
		HandlerTimeout: 10 * time.Second, CallLease: 2 * time.Second}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

var refundOffset atomic.Int64

// refund is a delivery of order's refund, a message of its own each time. A copy has the
// same payload, and another uuid and offset.
func refund(order string) (*message.Message, inbox.Source) {
	return message.NewMessage(watermill.NewUUID(), []byte(`{"orderId":"`+order+`"}`)),
		inbox.Source{Topic: "refunds", Partition: 0, Offset: refundOffset.Add(1)}
}

func refunded(t *testing.T, d testenv.Database, order string) int {
	return count(t, d.DB, `SELECT COUNT(*) FROM refund WHERE order_id = ?`, order)
}

// TestOneOutsideCallPerKey checks that a key's outside calls are made once, by one path at
// a time, whatever runs the key. The paths are the partition's delivery, a copy of it, the
// delayed redeliverer, a replay and another router. Each case counts the calls at a real
// HTTP server. Each fails where a path called Prepare before it knew the key's row.
func TestOneOutsideCallPerKey(t *testing.T) {
	ctx := context.Background()

	// An order is delayed while the provider is down. It is delivered again as a copy once
	// the provider is back, then redelivered. The copy is held, because the row waits for
	// its redelivery, and makes no call. The redelivery makes the one call.
	t.Run("delayed, a copy, then the redeliverer", func(t *testing.T) {
		d := refundsDB(t)
		p := newProvider(t, 0)
		ib := refundInbox(t, d, p)
		b, err := ib.NewBatcher(engine.BatchConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		p.down.Store(true)
		if r, err := batched(b, "A"); err != nil || r.Outcome != engine.OutcomeDelayed {
			t.Fatalf("A while the provider is down: %+v, %v; want delayed", r, err)
		}
		p.down.Store(false)
		if r, err := batched(b, "A"); err != nil || r.Outcome != engine.OutcomeHeld {
			t.Fatalf("a copy of delayed A: %+v, %v; want held", r, err)
		}
		if r, err := alone(ib, "A", engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeHeld {
			t.Fatalf("a copy of delayed A, one at a time: %+v, %v; want held", r, err)
		}
		if n, err := ib.RedeliverDue(ctx, time.Now().Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("redelivered %d, %v; want 1", n, err)
		}
		for _, run := range []func() (engine.Result, error){
			func() (engine.Result, error) { return batched(b, "A") },
			func() (engine.Result, error) { return alone(ib, "A", engine.ProcessOptions{}) },
		} {
			if r, err := run(); err != nil || r.Outcome != engine.OutcomeDuplicate {
				t.Fatalf("a copy of done A: %+v, %v; want duplicate", r, err)
			}
		}
		if n := refunded(t, d, "A"); n != 1 {
			t.Fatalf("A refunded %d times", n)
		}
		p.check(t, "A")
	})

	// A transaction that rolls back after the calls were made is retried with what Prepare
	// made. Here the handler's first Handle fails. The calls are not made again, one at a
	// time or under group commit.
	t.Run("a retry after a rolled-back transaction", func(t *testing.T) {
		d := refundsDB(t)
		p := newProvider(t, 0)
		ib := refundInbox(t, d, p, "F1", "F2")
		b, err := ib.NewBatcher(engine.BatchConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if r, err := alone(ib, "F1", engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeProcessed || r.Attempts != 2 {
			t.Fatalf("F1: %+v, %v; want processed at the second attempt", r, err)
		}
		if r, err := batched(b, "F2"); err != nil || r.Outcome != engine.OutcomeProcessed {
			t.Fatalf("F2: %+v, %v; want processed", r, err)
		}
		p.check(t, "F1", "F2")
	})

	// Three routers run copies of each key at once, over a slow provider. They have their
	// own inboxes on one database, and one of them is replaying.
	t.Run("copies at once on three routers and a replay", func(t *testing.T) {
		d := refundsDB(t)
		p := newProvider(t, 100*time.Millisecond)
		var batchers []*engine.Batcher
		var inboxes []*engine.Inbox
		for range 3 {
			ib := refundInbox(t, d, p)
			b, err := ib.NewBatcher(engine.BatchConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			inboxes, batchers = append(inboxes, ib), append(batchers, b)
		}
		keys := make([]string, 20)
		var wg sync.WaitGroup
		errs := make(chan error, 4*len(keys))
		for i := range keys {
			keys[i] = fmt.Sprintf("K%02d", i)
			k := keys[i]
			for _, b := range batchers {
				wg.Go(func() {
					if _, err := batched(b, k); err != nil {
						errs <- err
					}
				})
			}
			wg.Go(func() {
				if _, err := alone(inboxes[2], k, engine.ProcessOptions{Reopen: true}); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for _, k := range keys {
			if n := refunded(t, d, k); n != 1 {
				t.Fatalf("%s refunded %d times", k, n)
			}
		}
		p.check(t, keys...)
	})
}

// batched delivers a new message of order's refund through b.
func batched(b *engine.Batcher, order string) (engine.Result, error) {
	msg, src := refund(order)
	return b.Process(context.Background(), msg, src)
}

// alone delivers a new message of order's refund through ib, one at a time.
func alone(ib *engine.Inbox, order string, opts engine.ProcessOptions) (engine.Result, error) {
	msg, src := refund(order)
	return ib.Process(context.Background(), msg, src, opts)
}

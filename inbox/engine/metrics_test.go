package engine_test

import (
	"bufio"
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/metrics"
)

// metricsObserver is how the runtime feeds the inbox's outcomes to Prometheus.
type metricsObserver struct{ m *metrics.Metrics }

func (o metricsObserver) Delivered(biz string, r engine.Result, d time.Duration) {
	o.m.Observe(biz, string(r.Outcome), d)
}

// scrape fetches /metrics from the handler the admin listener serves and returns the
// samples by "name{labels}".
func scrape(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsMoveWithDeliveries checks that after a run with duplicates, poison and a
// conflict, the metrics say what happened. They are the delivery counters, the handler
// latency histogram, the inbox rows by status and the outbox gauges.
func TestMetricsMoveWithDeliveries(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	m := metrics.New(p.db.DB)
	ib, err := engine.New(p.db.DB, p.granter, engine.Config{BizType: coupon.BizType}, watermill.NopLogger{}, metricsObserver{m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deliver := func(msg *message.Message, offset int64) {
		t.Helper()
		if _, err := ib.Process(ctx, msg, inbox.Source{Topic: "order-paid", Offset: offset}, engine.ProcessOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range []string{"m-1", "m-2", "m-3", "m-1", "m-2"} { // 3 orders, 2 duplicates
		deliver(orderMsg(id, "u1"), int64(i))
	}
	deliver(message.NewMessage(watermill.NewUUID(), []byte("not json")), 10) // poison
	deliver(orderMsg("m-3", "someone-else"), 11)                             // conflict

	s := scrape(t, m)
	want := map[string]float64{
		`onceflow_inbox_deliveries_total{biz_type="coupon",outcome="processed"}`:      3,
		`onceflow_inbox_deliveries_total{biz_type="coupon",outcome="duplicate"}`:      2,
		`onceflow_inbox_deliveries_total{biz_type="coupon",outcome="quarantined"}`:    1,
		`onceflow_inbox_deliveries_total{biz_type="coupon",outcome="conflict"}`:       1,
		`onceflow_inbox_handler_seconds_count{biz_type="coupon",outcome="processed"}`: 3,
		`onceflow_inbox_handler_seconds_count{biz_type="coupon",outcome="duplicate"}`: 2,
		`onceflow_inbox_rows{biz_type="coupon",status="done"}`:                        3,
		`onceflow_inbox_rows{biz_type="coupon",status="failed"}`:                      2, // poison + conflict
		`onceflow_outbox_unpublished_rows`:                                            3,
		`onceflow_relay_published_total`:                                              0,
	}
	for k, v := range want {
		got, ok := s[k]
		if !ok {
			t.Errorf("%s missing from /metrics", k)
		} else if got != v {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
	if s[`onceflow_inbox_handler_seconds_sum{biz_type="coupon",outcome="processed"}`] <= 0 {
		t.Error("handler latency sum did not move")
	}
	if age, ok := s["onceflow_outbox_oldest_unpublished_seconds"]; !ok || age < 0 {
		t.Errorf("oldest unpublished age = %v (present %v)", age, ok)
	}
}

// TestHeldDeliveryOfQuarantinedKey checks that a new delivery of a quarantined key is
// held. It is not run, and the row is left failed. It is counted as held, not as a
// duplicate, on both paths, one delivery per transaction and the group-commit Batcher.
// After a replay releases the key, the next delivery is a duplicate. The outcome label
// keeps its fixed set of values.
func TestHeldDeliveryOfQuarantinedKey(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	p := newPipeline(t, pipelineOpts{conns: 4})
	m := metrics.New(p.db.DB)
	ib, err := engine.New(p.db.DB, failUntilFixed(&broken)(p.granter), engine.Config{BizType: coupon.BizType, MaxAttempts: 1, DelayedRetries: -1}, watermill.NopLogger{}, metricsObserver{m})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ib.NewBatcher(engine.BatchConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	src := inbox.Source{Topic: "order-paid", Offset: 1}
	if r, err := ib.Process(ctx, orderMsg("o-held", "u1"), src, engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeQuarantined {
		t.Fatalf("first delivery: %+v %v, want quarantined", r, err)
	}
	broken.Store(false) // fixed: a delivery that ran now would be granted
	deliveries := []struct {
		name    string
		process func() (engine.Result, error)
	}{
		{"one at a time", func() (engine.Result, error) {
			return ib.Process(ctx, orderMsg("o-held", "u1"), src, engine.ProcessOptions{})
		}},
		{"batched", func() (engine.Result, error) { return b.Process(ctx, orderMsg("o-held", "u1"), src) }},
	}
	for _, d := range deliveries {
		r, err := d.process()
		if err != nil || r.Outcome != engine.OutcomeHeld || r.Reason != engine.ReasonRetriesExhausted {
			t.Fatalf("%s: later delivery of the quarantined key: %+v %v, want held (retries_exhausted)", d.name, r, err)
		}
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM inbox WHERE dedup_key = 'o-held' AND status = 'failed' AND duplicates = 2"); n != 1 {
		t.Fatal("the held key's row is not failed with its 2 held deliveries counted")
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon"); n != 0 {
		t.Fatalf("%d coupons from held deliveries, want 0", n)
	}
	s := scrape(t, m)
	for k, v := range map[string]float64{
		`onceflow_inbox_deliveries_total{biz_type="coupon",outcome="quarantined"}`: 1,
		`onceflow_inbox_deliveries_total{biz_type="coupon",outcome="held"}`:        2,
		`onceflow_inbox_deliveries_total{biz_type="coupon",outcome="duplicate"}`:   0,
	} {
		if s[k] != v {
			t.Errorf("%s = %v, want %v", k, s[k], v)
		}
	}
	if tp := m.Throughput().Totals; tp.Held != 2 || tp.Duplicate != 0 {
		t.Errorf("console throughput totals %+v, want 2 held and no duplicate", tp)
	}

	// The operator releases the key. The replay runs the row, and later deliveries are
	// duplicates.
	if rep, err := inboxops.Replay(ctx, ib, inboxops.ReplayOptions{Filter: failedFilter()}); err != nil || rep.Processed != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	for _, d := range deliveries {
		if r, err := d.process(); err != nil || r.Outcome != engine.OutcomeDuplicate || r.Reason != "" {
			t.Fatalf("%s: delivery after the replay: %+v %v, want duplicate", d.name, r, err)
		}
	}
	if n := count(t, p.db.DB, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-held'"); n != 1 {
		t.Fatalf("coupons = %d, want 1", n)
	}
	s = scrape(t, m)
	if k := `onceflow_inbox_deliveries_total{biz_type="coupon",outcome="duplicate"}`; s[k] != 2 {
		t.Errorf("%s = %v, want 2", k, s[k])
	}
	known := map[string]bool{"processed": true, "duplicate": true, "held": true, "quarantined": true, "conflict": true}
	for k := range s {
		if rest, ok := strings.CutPrefix(k, `onceflow_inbox_deliveries_total{biz_type="coupon",outcome="`); ok && !known[strings.TrimSuffix(rest, `"}`)] {
			t.Errorf("outcome label value outside the fixed set: %s", k)
		}
	}
}

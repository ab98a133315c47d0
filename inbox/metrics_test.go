package inbox_test

import (
	"bufio"
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/metrics"
)

// metricsObserver is how cmd/router feeds the inbox's outcomes to Prometheus.
type metricsObserver struct{ m *metrics.Metrics }

func (o metricsObserver) Delivered(biz string, r inbox.Result, d time.Duration) {
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

// After a run with duplicates, poison and a conflict, the delivery counters, the handler
// latency histogram, inbox rows by status and the outbox gauges say what happened.
func TestMetricsMoveWithDeliveries(t *testing.T) {
	p := newPipeline(t, pipelineOpts{})
	m := metrics.New(p.db.DB)
	ib, err := inbox.New(p.db.DB, p.granter, inbox.Config{BizType: coupon.BizType}, watermill.NopLogger{}, metricsObserver{m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deliver := func(msg *message.Message, offset int64) {
		t.Helper()
		if _, err := ib.Process(ctx, msg, inbox.Source{Topic: "order-paid", Offset: offset}, inbox.ProcessOptions{}); err != nil {
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

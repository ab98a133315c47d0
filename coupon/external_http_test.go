package coupon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// httpService is a service calling url with timeout and maxConns.
func httpService(t *testing.T, url string, timeout time.Duration, maxConns int) *coupon.HTTPService {
	t.Helper()
	s, err := coupon.NewHTTPService(coupon.HTTPConfig{URL: url, Timeout: timeout, MaxConns: maxConns})
	if err != nil {
		t.Fatalf("NewHTTPService: %v", err)
	}
	return s
}

// TestHTTPServiceRequest checks that a call is a POST of no body to <url>/<step> with the
// key in Idempotency-Key. Calls in turn share one kept-alive connection.
func TestHTTPServiceRequest(t *testing.T) {
	type seen struct{ method, path, key, body string }
	var (
		mu    sync.Mutex
		calls []seen
		conns atomic.Int64
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, seen{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), string(b)})
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	s := httpService(t, srv.URL+"/v1/", time.Minute, 4)
	for _, step := range []string{"lock_stock", "deduct_budget", "write_wallet"} {
		if err := s.Call(context.Background(), step, "o-1:"+step); err != nil {
			t.Fatalf("call %s: %v", step, err)
		}
	}
	want := []seen{
		{"POST", "/v1/lock_stock", "o-1:lock_stock", ""},
		{"POST", "/v1/deduct_budget", "o-1:deduct_budget", ""},
		{"POST", "/v1/write_wallet", "o-1:write_wallet", ""},
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Errorf("calls %+v, want %+v", calls, want)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for three calls in turn, want 1 (kept alive)", n)
	}
}

// TestHTTPServiceStatus checks that a 2xx answer is success. A 4xx that refuses for good
// is a permanent error, and anything else is an error the inbox retries. A redirect is not
// followed.
func TestHTTPServiceStatus(t *testing.T) {
	var redirected atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere/lock_stock" {
			redirected.Add(1)
			return
		}
		var status int
		if _, err := fmt.Sscanf(r.URL.Path, "/%d/", &status); err != nil {
			t.Errorf("path %s", r.URL.Path)
		}
		if status == http.StatusFound {
			w.Header().Set("Location", "/elsewhere/lock_stock")
		}
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, "answer\n%d", status)
	}))
	defer srv.Close()

	cases := []struct {
		status    int
		ok        bool
		permanent bool
	}{
		{200, true, false},
		{201, true, false},
		{204, true, false},
		{302, false, false},
		{400, false, true},
		{404, false, true},
		{422, false, true},
		{408, false, false},
		{409, false, false},
		{429, false, false},
		{500, false, false},
		{502, false, false},
		{503, false, false},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			s := httpService(t, fmt.Sprintf("%s/%d", srv.URL, tc.status), time.Minute, 4)
			err := s.Call(context.Background(), "lock_stock", "o-2:lock_stock")
			if tc.ok {
				if err != nil {
					t.Fatalf("call: %v, want success", err)
				}
				return
			}
			var se *coupon.HTTPStatusError
			if !errors.As(err, &se) || se.Status != tc.status || se.Step != "lock_stock" || se.Key != "o-2:lock_stock" {
				t.Fatalf("call: %v, want an HTTPStatusError of %d", err, tc.status)
			}
			if want := fmt.Sprintf("answer %d", tc.status); se.Body != want {
				t.Errorf("error body %q, want %q", se.Body, want)
			}
			if got := errors.Is(err, inbox.ErrPermanent); got != tc.permanent {
				t.Errorf("permanent %v, want %v (%v)", got, tc.permanent, err)
			}
		})
	}
	if n := redirected.Load(); n != 0 {
		t.Errorf("the redirect was followed %d times", n)
	}
}

// TestHTTPServiceUnreachableAndTimeout checks that a connection refused and a call past
// its timeout are errors the inbox retries.
func TestHTTPServiceUnreachableAndTimeout(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close() // nothing listens there now
		err = httpService(t, "http://"+addr, time.Minute, 4).Call(context.Background(), "lock_stock", "o-3:lock_stock")
		if err == nil || errors.Is(err, inbox.ErrPermanent) {
			t.Fatalf("call to a closed port: %v, want a retryable error", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		defer srv.Close()
		defer close(release)
		err := httpService(t, srv.URL, 50*time.Millisecond, 4).Call(context.Background(), "deduct_budget", "o-3:deduct_budget")
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, inbox.ErrPermanent) || !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("call of a hanging service: %v, want a retryable timeout", err)
		}
	})
	t.Run("caller cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cancel()
			<-r.Context().Done()
		}))
		defer srv.Close()
		err := httpService(t, srv.URL, time.Minute, 4).Call(ctx, "deduct_budget", "o-3:deduct_budget")
		if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "timed out") {
			t.Fatalf("call whose caller gave up: %v, want context.Canceled", err)
		}
	})
}

// TestHTTPServiceBodyLimit checks that a call reads a bounded part of the answer. A
// success whose body never ends returns, and an error quotes only the first bytes of its
// body.
func TestHTTPServiceBodyLimit(t *testing.T) {
	const endless = 256 << 20
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail/lock_stock" {
			w.WriteHeader(http.StatusInternalServerError)
		}
		chunk := []byte(strings.Repeat("x", 32<<10))
		for n := 0; n < endless; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return // the caller stopped reading
			}
			written.Add(int64(len(chunk)))
		}
	}))
	defer srv.Close()

	if err := httpService(t, srv.URL, time.Minute, 4).Call(context.Background(), "lock_stock", "o-4:lock_stock"); err != nil {
		t.Fatalf("call answered 200 with a long body: %v", err)
	}
	err := httpService(t, srv.URL+"/fail", time.Minute, 4).Call(context.Background(), "lock_stock", "o-4:lock_stock")
	var se *coupon.HTTPStatusError
	if !errors.As(err, &se) || se.Status != http.StatusInternalServerError {
		t.Fatalf("call answered 500: %v", err)
	}
	if len(se.Body) > 1024 || len(err.Error()) > 2048 {
		t.Errorf("the error quotes %d bytes of the body (%d in all)", len(se.Body), len(err.Error()))
	}
	srv.Close() // waits for both handlers
	if n := written.Load(); n >= 2*endless {
		t.Errorf("the server wrote its whole bodies (%d bytes): the calls read them to the end", n)
	}
}

// TestHTTPServiceMaxConns checks that at most MaxConns calls reach the service at once.
// The others wait for a connection.
func TestHTTPServiceMaxConns(t *testing.T) {
	var inFlight, most, conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond) // long enough for the others to pile up
		inFlight.Add(-1)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	s := httpService(t, srv.URL, time.Minute, 2)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if err := s.Call(context.Background(), "write_wallet", fmt.Sprintf("o-%d:write_wallet", i)); err != nil {
				t.Errorf("call %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if m, c := most.Load(), conns.Load(); m > 2 || c > 2 {
		t.Errorf("%d calls at once over %d connections, want at most 2", m, c)
	}
}

// TestDownstreamSettings checks the plugin's settings. downstream_url selects the HTTP
// service, is checked, and excludes the simulated service's settings.
func TestDownstreamSettings(t *testing.T) {
	ok := coupon.DefaultConfig()
	ok.DownstreamURL = "http://127.0.0.1:8490"
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(%+v): %v", ok, err)
	}
	cases := []struct {
		name string
		set  func(*coupon.Config)
		want string
	}{
		{"no scheme", func(c *coupon.Config) { c.DownstreamURL = "127.0.0.1:8490" }, "downstream_url"},
		{"ftp", func(c *coupon.Config) { c.DownstreamURL = "ftp://127.0.0.1/" }, "downstream_url"},
		{"query", func(c *coupon.Config) { c.DownstreamURL = "http://127.0.0.1:8490/?a=1" }, "downstream_url"},
		{"zero timeout", func(c *coupon.Config) { c.DownstreamTimeout = 0 }, "downstream_timeout"},
		{"no connection", func(c *coupon.Config) { c.DownstreamMaxConns = 0 }, "downstream_max_conns"},
		{"with a step delay", func(c *coupon.Config) { c.StepDelay = time.Millisecond }, "step_delay"},
		{"with failures", func(c *coupon.Config) { c.StepFailureRate = 0.1 }, "step_failure_rate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.set(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestHTTPServicePlugin checks that the plugin's handler on an HTTP service is a Preparer.
// Its calls are made before the transaction, each step once and in order. A 4xx that
// refuses for good quarantines the order at once as permanent, after one call.
func TestHTTPServicePlugin(t *testing.T) {
	var (
		mu    sync.Mutex
		calls []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		calls = append(calls, r.URL.Path+" "+key)
		mu.Unlock()
		if strings.HasPrefix(key, "refused-") {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	d := testenv.DB(t, 4, couponSchema)
	cfg := campaign("http-1", 100, 100*valueCents)
	h := plugin(t, d.DB, setup(t, d.DB, cfg, httpService(t, srv.URL, time.Minute, 4)))
	if _, ok := h.(inbox.Preparer); !ok {
		t.Fatalf("the plugin's handler on an HTTP service is a %T, want an inbox.Preparer", h)
	}
	ib, err := engine.New(d.DB, h, engine.Config{BizType: coupon.BizType, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		id      string
		outcome engine.Outcome
		reason  engine.Reason
		calls   []string
	}{
		{"granted-1", engine.OutcomeProcessed, "", []string{"/lock_stock granted-1:lock_stock", "/deduct_budget granted-1:deduct_budget", "/write_wallet granted-1:write_wallet"}},
		{"refused-1", engine.OutcomeQuarantined, engine.ReasonPermanent, []string{"/lock_stock refused-1:lock_stock"}},
	} {
		mu.Lock()
		calls = nil
		mu.Unlock()
		payload, err := json.Marshal(order(tc.id))
		if err != nil {
			t.Fatal(err)
		}
		res, err := ib.Process(context.Background(), message.NewMessage(watermill.NewUUID(), payload), inbox.Source{Topic: "order-paid", Offset: int64(i)}, engine.ProcessOptions{})
		if err != nil || res.Outcome != tc.outcome || res.Reason != tc.reason {
			t.Errorf("order %s: %+v %v, want %s %s", tc.id, res, err, tc.outcome, tc.reason)
		}
		mu.Lock()
		if fmt.Sprint(calls) != fmt.Sprint(tc.calls) {
			t.Errorf("order %s: calls %q, want %q", tc.id, calls, tc.calls)
		}
		mu.Unlock()
	}
	if n := count(t, d.DB, `SELECT COUNT(*) FROM user_coupon WHERE order_id = ?`, "granted-1"); n != 1 {
		t.Errorf("order granted-1 has %d coupons, want 1", n)
	}
	if n := count(t, d.DB, `SELECT COUNT(*) FROM coupon_grant WHERE order_id = ?`, "refused-1"); n != 0 {
		t.Errorf("order refused-1 has %d grants, want none", n)
	}
}

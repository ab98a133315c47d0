package main

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The ledger counts a call of a key and step after one of them was answered 2xx (apart when
// its order had a call fail since), and each pair of calls of a key and step running at
// once; retries after failures, calls running at once for different keys or steps, and a
// call starting as another ends are neither.
func TestLedgerCounts(t *testing.T) {
	t0 := time.Date(2024, 11, 11, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := newLedger()

	// o-1:lock_stock fails, is retried, succeeds: nothing odd.
	l.start("o-1:lock_stock", "lock_stock", at(0), true)(503, at(1))
	l.start("o-1:lock_stock", "lock_stock", at(2), false)(500, at(3))
	l.start("o-1:lock_stock", "lock_stock", at(3), false)(200, at(4))
	// Another step and another key at the same time: nothing odd.
	endA := l.start("o-1:deduct_budget", "deduct_budget", at(5), false)
	endB := l.start("o-2:deduct_budget", "deduct_budget", at(5), false)
	endA(200, at(6))
	endB(200, at(6))
	if s := l.snapshot(false); s.AfterSuccess != 0 || s.Overlapping != 0 || s.Total != 5 || s.Successful != 3 || s.DuringOutage != 1 || s.KeySteps != 3 {
		t.Fatalf("after calls made once in effect: %+v, want 5 calls, 3 successful, 1 in an outage, 3 keys and steps, nothing odd", s.counts)
	}

	// A call after success.
	l.start("o-1:lock_stock", "lock_stock", at(10), false)(200, at(11))
	// A call after success that follows a failed call of another step of its order.
	l.start("o-5:lock_stock", "lock_stock", at(12), false)(200, at(13))
	l.start("o-5:deduct_budget", "deduct_budget", at(13), false)(500, at(14))
	l.start("o-5:lock_stock", "lock_stock", at(15), false)(200, at(16))
	// An overlapping pair, the second answered first, neither after a success.
	end1 := l.start("o-3:write_wallet", "write_wallet", at(20), false)
	end2 := l.start("o-3:write_wallet", "write_wallet", at(21), false)
	end2(503, at(22))
	end1(503, at(23))
	// Three at once: three more pairs.
	var ends []func(int, time.Time) callRecord
	for i := range 3 {
		ends = append(ends, l.start("o-4:write_wallet", "write_wallet", at(30+i), false))
	}
	for _, end := range ends {
		end(200, at(40))
	}
	s := l.snapshot(true)
	if s.AfterSuccess != 2 || s.AfterFailure != 1 || s.Overlapping != 4 {
		t.Fatalf("calls_after_success %d (after a failure %d) overlapping_calls %d, want 2 (1) and 4 (%+v)", s.AfterSuccess, s.AfterFailure, s.Overlapping, s.Odd)
	}
	if len(s.Odd) != 5 || s.Odd[0].Key != "o-1:lock_stock" || s.Odd[0].Kind != "after_success" || !s.Odd[0].Success.Equal(at(4)) || s.Odd[0].Calls != 4 ||
		s.Odd[1].Key != "o-5:lock_stock" || s.Odd[1].Kind != "after_success_after_failure" || !s.Odd[1].Failure.Equal(at(14)) ||
		s.Odd[2].Key != "o-3:write_wallet" || s.Odd[2].Kind != "overlapping" {
		t.Errorf("odd calls %+v", s.Odd)
	}
	if got := s.Calls["o-1:lock_stock"]["lock_stock"]; got != 4 {
		t.Errorf("o-1:lock_stock called %d times, want 4", got)
	}
	if got := s.summary(); !strings.HasSuffix(got, " calls_after_success_after_failure=1 calls_after_success=2 overlapping_calls=4") || !strings.HasPrefix(got, "DOWNSTREAM calls=14 ") {
		t.Errorf("summary %q", got)
	}
}

// Over HTTP: a call is a POST to its step with an Idempotency-Key, answered 200 outside an
// outage and 503 in one (started and ended by the admin endpoint); /stats counts them and
// the call after a success.
func TestServerCallsAndStats(t *testing.T) {
	s := &server{steps: map[string]bool{"lock_stock": true}, ledger: newLedger(), outage: &outage{}, rng: rand.New(rand.NewPCG(1, 2))}
	srv := httptest.NewServer(s.routes())
	defer srv.Close()
	call := func(method, path, key string) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	steps := []struct {
		method, path, key string
		want              int
	}{
		{"POST", "/lock_stock", "", http.StatusBadRequest},
		{"GET", "/lock_stock", "o-1:lock_stock", http.StatusMethodNotAllowed},
		{"POST", "/no_such_step", "o-1:no_such_step", http.StatusNotFound},
		{"POST", "/admin/outage?for=1h", "", http.StatusOK},
		{"POST", "/lock_stock", "o-1:lock_stock", http.StatusServiceUnavailable},
		{"DELETE", "/admin/outage", "", http.StatusOK},
		{"POST", "/lock_stock", "o-1:lock_stock", http.StatusOK},
		{"POST", "/lock_stock", "o-1:lock_stock", http.StatusOK}, // after success
	}
	for _, st := range steps {
		if got := call(st.method, st.path, st.key); got != st.want {
			t.Fatalf("%s %s (key %q): %d, want %d", st.method, st.path, st.key, got, st.want)
		}
	}
	resp, err := srv.Client().Get(srv.URL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got stats
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Total != 3 || got.Successful != 2 || got.DuringOutage != 1 || got.AfterSuccess != 1 || got.Overlapping != 0 ||
		got.ByStatus[503] != 1 || got.ByStatus[200] != 2 || got.Calls["o-1:lock_stock"]["lock_stock"] != 3 || len(got.Outages) != 1 || got.InOutage {
		t.Errorf("stats %+v", got)
	}

	var out bytes.Buffer
	if err := fetchStats(srv.URL, "", &out); err != nil {
		t.Fatal(err)
	}
	if line := out.String(); !strings.HasSuffix(line, " calls_after_success=1 overlapping_calls=0\n") {
		t.Errorf("-fetch-stats printed %q", line)
	}

	// -start-outage puts it down.
	if err := requestOutage(srv.URL, time.Hour, &out); err != nil {
		t.Fatal(err)
	}
	if got := call("POST", "/lock_stock", "o-2:lock_stock"); got != http.StatusServiceUnavailable {
		t.Errorf("a call after -start-outage: %d, want 503", got)
	}
}

// The scheduled outage: calls in it are down, calls before and after it are not.
func TestOutageSchedule(t *testing.T) {
	t0 := time.Date(2024, 11, 11, 0, 0, 0, 0, time.UTC)
	var o outage
	o.set(t0.Add(20*time.Second), 65*time.Second)
	for _, tc := range []struct {
		after time.Duration
		down  bool
	}{{0, false}, {20 * time.Second, true}, {84 * time.Second, true}, {85 * time.Second, false}} {
		if got := o.at(t0.Add(tc.after)); got != tc.down {
			t.Errorf("at +%v: down %v, want %v", tc.after, got, tc.down)
		}
	}
	o.set(t0.Add(30*time.Second), 0) // ended early
	if o.at(t0.Add(40 * time.Second)) {
		t.Error("down after the outage was ended")
	}
}

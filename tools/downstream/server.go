package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// server is the downstream: the steps' endpoints, /stats and the outage switch.
type server struct {
	steps    map[string]bool
	delay    time.Duration
	jitter   time.Duration
	failRate float64
	hang     bool // an outage holds calls until the caller gives up, instead of answering 503

	ledger *ledger
	outage *outage

	mu  sync.Mutex
	rng *rand.Rand
	log *bufio.Writer // the call log, one JSON line per call; nil: none
}

// outage is when the downstream is down: spans, the last possibly open-ended.
type outage struct {
	mu    sync.Mutex
	spans []outageSpan
}

// outageSpan is one outage; End is when it ends (or ended).
type outageSpan struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// at reports whether t is within an outage.
func (o *outage) at(t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.spans {
		if !t.Before(s.Start) && t.Before(s.End) {
			return true
		}
	}
	return false
}

// until is when the outage at t ends (t itself when there is none).
func (o *outage) until(t time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.spans {
		if !t.Before(s.Start) && t.Before(s.End) {
			return s.End
		}
	}
	return t
}

// set puts the downstream down from start for d; an outage running at start ends there.
func (o *outage) set(start time.Time, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range o.spans {
		if s := &o.spans[i]; !start.Before(s.Start) && start.Before(s.End) {
			s.End = start
		}
	}
	if d > 0 {
		o.spans = append(o.spans, outageSpan{Start: start, End: start.Add(d)})
	}
}

func (o *outage) list() []outageSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]outageSpan{}, o.spans...)
}

func (s *server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /stats", s.stats)
	mux.HandleFunc("POST /admin/outage", s.startOutage)
	mux.HandleFunc("DELETE /admin/outage", s.endOutage)
	mux.HandleFunc("/", s.call)
	return mux
}

// call answers a step's call: POST /<step> with an Idempotency-Key.
func (s *server) call(w http.ResponseWriter, r *http.Request) {
	step := strings.TrimPrefix(r.URL.Path, "/")
	key := r.Header.Get("Idempotency-Key")
	switch {
	case !s.steps[step]:
		http.Error(w, "no such step", http.StatusNotFound)
		return
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "a step's call is a POST", http.StatusMethodNotAllowed)
		return
	case key == "":
		http.Error(w, "Idempotency-Key missing", http.StatusBadRequest)
		return
	}
	start := time.Now()
	down := s.outage.at(start)
	end := s.ledger.start(key, step, start, down)
	status := s.answer(r, start, down)
	rec := end(status, time.Now())
	s.record(rec)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"key": key, "step": step, "status": status})
}

// statusClientGone is recorded for a call whose caller left before it was answered.
const statusClientGone = 499

// answer is the status a call gets, after its delay: 503 in an outage (or, hanging, when
// the caller gives up or the outage ends), 500 for an injected failure, else 200.
func (s *server) answer(r *http.Request, start time.Time, down bool) int {
	if down {
		if !s.hang {
			return http.StatusServiceUnavailable
		}
		t := time.NewTimer(time.Until(s.outage.until(start)))
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return statusClientGone
		case <-t.C:
			return http.StatusServiceUnavailable
		}
	}
	s.mu.Lock()
	d := s.delay
	if s.jitter > 0 {
		d += time.Duration(s.rng.Int64N(int64(s.jitter)))
	}
	fail := s.failRate > 0 && s.rng.Float64() < s.failRate
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return statusClientGone
		case <-t.C:
		}
	}
	if fail {
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// record writes c to the call log.
func (s *server) record(c callRecord) {
	if s.log == nil {
		return
	}
	b, err := json.Marshal(c)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.log.Write(append(b, '\n'))
}

// flush writes out what the call log holds.
func (s *server) flush() error {
	if s.log == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Flush()
}

// stats answers the ledger's counts as JSON; ?keys=0 leaves out the calls per key and step.
func (s *server) stats(w http.ResponseWriter, r *http.Request) {
	st := s.snapshot(r.URL.Query().Get("keys") != "0")
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	_ = enc.Encode(st)
}

func (s *server) snapshot(perKey bool) stats {
	st := s.ledger.snapshot(perKey)
	now := time.Now()
	st.InOutage, st.Outages = s.outage.at(now), s.outage.list()
	return st
}

// startOutage puts the downstream down now for ?for= (a duration, e.g. 65s).
func (s *server) startOutage(w http.ResponseWriter, r *http.Request) {
	d, err := time.ParseDuration(r.URL.Query().Get("for"))
	if err != nil || d <= 0 {
		http.Error(w, "for: a positive duration, e.g. ?for=65s", http.StatusBadRequest)
		return
	}
	now := time.Now()
	s.outage.set(now, d)
	_, _ = fmt.Fprintf(w, "down from %s until %s\n", now.Format(time.RFC3339Nano), now.Add(d).Format(time.RFC3339Nano))
}

// endOutage ends a running outage now.
func (s *server) endOutage(w http.ResponseWriter, _ *http.Request) {
	s.outage.set(time.Now(), 0)
	_, _ = w.Write([]byte("up\n"))
}

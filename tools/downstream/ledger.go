package main

import (
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ledger records every call and counts what a caller making each call once in effect
// never causes: a call of a key and step after one of them was answered 2xx, and two calls
// of a key and step at once.
//
// A key is <order>:<step>, as the coupon plugin builds it. A call after success that follows
// a failed call of another step of its order is counted apart too: the caller retried the
// order's calls from the first step its grant had not committed, this one included.
type ledger struct {
	mu       sync.Mutex
	calls    map[keyStep]*keyCalls
	failures map[string]time.Time // order → when its last failed call ended
	st       counts
	odd      []oddCall // the first maxOdd calls after success or overlapping, for the logs
}

// keyStep is what a call is counted by: its idempotency key and its step.
type keyStep struct{ key, step string }

// keyCalls is one key and step's calls.
type keyCalls struct {
	calls     int
	running   int       // calls started and not ended
	succeeded time.Time // when its first 2xx answer was given; zero before
}

// counts are the ledger's totals.
type counts struct {
	Total        int `json:"total_calls"`
	Successful   int `json:"successful_calls"` // answered 2xx
	DuringOutage int `json:"outage_calls"`     // arrived during an outage
	AfterSuccess int `json:"calls_after_success"`
	// AfterFailure: calls after success whose order had a call fail since that success.
	AfterFailure int         `json:"calls_after_success_after_failure"`
	Overlapping  int         `json:"overlapping_calls"` // pairs of calls of one key and step running at once
	KeySteps     int         `json:"key_steps"`         // distinct keys and steps called
	ByStatus     map[int]int `json:"by_status"`
}

// oddCall is a call counted after success or overlapping.
type oddCall struct {
	Key     string    `json:"key"`
	Step    string    `json:"step"`
	Kind    string    `json:"kind"` // after_success, after_success_after_failure or overlapping
	Start   time.Time `json:"start"`
	Success time.Time `json:"success,omitzero"` // when the key and step's 2xx was answered
	Failure time.Time `json:"failure,omitzero"` // when a call of its order last failed
	Calls   int       `json:"calls"`            // the key and step's calls, this one included
}

// maxOdd bounds the odd calls a ledger keeps.
const maxOdd = 100

// callRecord is one call as the call log has it.
type callRecord struct {
	Key    string    `json:"key"`
	Step   string    `json:"step"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Status int       `json:"status"`
	Outage bool      `json:"outage,omitempty"`
}

func newLedger() *ledger {
	return &ledger{calls: map[keyStep]*keyCalls{}, failures: map[string]time.Time{}, st: counts{ByStatus: map[int]int{}}}
}

// orderOf is the order of a key: the key without its ":<step>" suffix.
func orderOf(key, step string) string { return strings.TrimSuffix(key, ":"+step) }

// start records a call of key and step arriving at t (during an outage or not) and
// returns its end: called once with the status it was answered and when, before the
// answer is written, so a call the caller makes after it starts after that end.
func (l *ledger) start(key, step string, t time.Time, outage bool) (end func(status int, t time.Time) callRecord) {
	ks := keyStep{key, step}
	l.mu.Lock()
	kc := l.calls[ks]
	if kc == nil {
		kc = &keyCalls{}
		l.calls[ks] = kc
		l.st.KeySteps++
	}
	kc.calls++
	l.st.Total++
	if outage {
		l.st.DuringOutage++
	}
	if !kc.succeeded.IsZero() {
		l.st.AfterSuccess++
		c := oddCall{Key: key, Step: step, Kind: "after_success", Start: t, Success: kc.succeeded, Calls: kc.calls}
		if f, ok := l.failures[orderOf(key, step)]; ok && f.After(kc.succeeded) {
			l.st.AfterFailure++
			c.Kind, c.Failure = "after_success_after_failure", f
		}
		l.noteOdd(c)
	}
	if kc.running > 0 {
		l.st.Overlapping += kc.running
		l.noteOdd(oddCall{Key: key, Step: step, Kind: "overlapping", Start: t, Success: kc.succeeded, Calls: kc.calls})
	}
	kc.running++
	l.mu.Unlock()
	return func(status int, e time.Time) callRecord {
		l.mu.Lock()
		defer l.mu.Unlock()
		kc.running--
		l.st.ByStatus[status]++
		if status >= 200 && status < 300 {
			l.st.Successful++
			if kc.succeeded.IsZero() {
				kc.succeeded = e
			}
		} else {
			l.failures[orderOf(key, step)] = e
		}
		return callRecord{Key: key, Step: step, Start: t, End: e, Status: status, Outage: outage}
	}
}

func (l *ledger) noteOdd(c oddCall) {
	if len(l.odd) < maxOdd {
		l.odd = append(l.odd, c)
	}
}

// stats is what /stats answers.
type stats struct {
	counts
	InOutage bool                      `json:"in_outage"`
	Outages  []outageSpan              `json:"outages"`
	Odd      []oddCall                 `json:"odd_calls"`          // the first calls after success or overlapping
	Calls    map[string]map[string]int `json:"calls_per_key_step"` // idempotency key → step → calls
}

// snapshot is the ledger's stats; perKey adds every key and step's calls.
func (l *ledger) snapshot(perKey bool) stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := stats{counts: l.st, Odd: append([]oddCall{}, l.odd...)}
	s.ByStatus = make(map[int]int, len(l.st.ByStatus))
	for k, v := range l.st.ByStatus {
		s.ByStatus[k] = v
	}
	if perKey {
		s.Calls = make(map[string]map[string]int, len(l.calls))
		for ks, kc := range l.calls {
			m := s.Calls[ks.key]
			if m == nil {
				m = map[string]int{}
				s.Calls[ks.key] = m
			}
			m[ks.step] = kc.calls
		}
	}
	return s
}

// summary is the one line of s the demo reads: name=value pairs.
func (s stats) summary() string {
	line := "DOWNSTREAM calls=" + strconv.Itoa(s.Total) + " successful=" + strconv.Itoa(s.Successful) +
		" outage_calls=" + strconv.Itoa(s.DuringOutage) + " key_steps=" + strconv.Itoa(s.KeySteps)
	codes := make([]int, 0, len(s.ByStatus))
	for c := range s.ByStatus {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		line += " status_" + strconv.Itoa(c) + "=" + strconv.Itoa(s.ByStatus[c])
	}
	return line + " calls_after_success_after_failure=" + strconv.Itoa(s.AfterFailure) +
		" calls_after_success=" + strconv.Itoa(s.AfterSuccess) + " overlapping_calls=" + strconv.Itoa(s.Overlapping)
}

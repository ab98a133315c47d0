package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// episode is one stretch of an alert being pending or firing, as the watcher saw it.
type episode struct {
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	Value       string
	Pending     time.Time // first seen pending (zero when first seen firing)
	Firing      time.Time // first seen firing; zero: never fired
	Last        time.Time // last seen
	Ended       bool      // gone from Prometheus's alerts
}

func (e *episode) key() string { return alertKey(e.Name, e.Labels) }

// String names the alert with its identifying labels (instance, biz_type, reason).
func (e *episode) String() string {
	var ls []string
	for _, k := range []string{"instance", "biz_type", "reason", "check", "topic"} {
		if v := e.Labels[k]; v != "" {
			ls = append(ls, k+"="+v)
		}
	}
	if len(ls) == 0 {
		return e.Name
	}
	return e.Name + "{" + strings.Join(ls, ",") + "}"
}

func alertKey(name string, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(name)
	for _, k := range keys {
		fmt.Fprintf(&b, ",%s=%s", k, labels[k])
	}
	return b.String()
}

// watcher polls Prometheus's alerts every second and keeps every episode.
type watcher struct {
	api string

	mu       sync.Mutex
	open     map[string]*episode
	episodes []*episode
	polls    int
	lastErr  error
}

func newWatcher(api string) *watcher { return &watcher{api: api, open: map[string]*episode{}} }

func (w *watcher) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		w.poll()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *watcher) poll() {
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []struct {
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
				State       string            `json:"state"`
				Value       string            `json:"value"`
			} `json:"alerts"`
		} `json:"data"`
	}
	r, err := client.Get(w.api + "/api/v1/alerts")
	if err == nil {
		if r.StatusCode != http.StatusOK {
			err = fmt.Errorf("/api/v1/alerts: %s", r.Status)
		} else {
			err = json.NewDecoder(r.Body).Decode(&resp)
		}
		r.Body.Close()
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.lastErr = err
		return
	}
	w.polls++
	seen := map[string]bool{}
	for _, a := range resp.Data.Alerts {
		name := a.Labels["alertname"]
		labels := map[string]string{}
		for k, v := range a.Labels {
			if k != "alertname" {
				labels[k] = v
			}
		}
		k := alertKey(name, labels)
		seen[k] = true
		e := w.open[k]
		if e == nil {
			e = &episode{Name: name, Labels: labels}
			w.open[k] = e
			w.episodes = append(w.episodes, e)
			if a.State == "pending" {
				e.Pending = now
			}
		}
		if a.State == "firing" && e.Firing.IsZero() {
			e.Firing = now
		}
		e.Annotations, e.Value, e.Last = a.Annotations, a.Value, now
	}
	for k, e := range w.open {
		if !seen[k] {
			e.Ended = true
			delete(w.open, k)
		}
	}
}

// snapshot copies the episodes.
func (w *watcher) snapshot() []episode {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]episode, len(w.episodes))
	for i, e := range w.episodes {
		out[i] = *e
	}
	return out
}

// firstFiring is the first episode of alert name that fired at or after since and that
// match accepts; nil when none did yet.
func (w *watcher) firstFiring(name string, since time.Time, match func(episode) bool) *episode {
	for _, e := range w.snapshot() {
		if e.Name == name && !e.Firing.IsZero() && !e.Firing.Before(since) && (match == nil || match(e)) {
			return &e
		}
	}
	return nil
}

// active lists the alerts pending or firing at the last poll.
func (w *watcher) active() []episode {
	var out []episode
	for _, e := range w.snapshot() {
		if !e.Ended {
			out = append(out, e)
		}
	}
	return out
}

// firedBetween lists the episodes that began firing in [from, to).
func (w *watcher) firedBetween(from, to time.Time) []episode {
	var out []episode
	for _, e := range w.snapshot() {
		if !e.Firing.IsZero() && !e.Firing.Before(from) && e.Firing.Before(to) {
			out = append(out, e)
		}
	}
	return out
}

// healthy reports whether the watcher has polled Prometheus, and its last error.
func (w *watcher) healthy() (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.polls, w.lastErr
}

func names(es []episode) string {
	if len(es) == 0 {
		return "-"
	}
	var out []string
	for _, e := range es {
		out = append(out, e.String())
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), " ")
}

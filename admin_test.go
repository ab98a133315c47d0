package onceflow

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// hungBroker accepts TCP connections and never answers: a broker that is up as far as the
// network can tell and useless otherwise.
type hungBroker struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startHungBroker(t *testing.T) *hungBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &hungBroker{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			c.Close()
		}
	})
	return b
}

func (b *hungBroker) accepted() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.conns)
}

// freeAddr returns a loopback address nothing listens on (admin.listen needs a port up front).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startTestAdmin runs startAdmin on a free port with kc as the Kafka config and returns the
// /readyz URL.
func startTestAdmin(t *testing.T, kc kafkax.Config) string {
	t.Helper()
	return startTestAdminWith(t, kc, metrics.New(nil)) + "/readyz"
}

// startTestAdminWith runs startAdmin with m and returns the listener's base URL.
func startTestAdminWith(t *testing.T, kc kafkax.Config, m *metrics.Metrics) string {
	t.Helper()
	d := testenv.DB(t, 2)
	addr := freeAddr(t)
	a := &Setup{Config: Config{Admin: AdminConfig{Listen: addr}}, logger: watermill.NopLogger{}}
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := a.startAdmin(ctx, d.DB, kc, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); stop() })
	return "http://" + addr
}

type readyz struct {
	code int
	body string
	err  error
}

// getReadyz asks /readyz once. bound is the longest it may take to answer: far more than
// the cache needs, far less than the old per-request check's hang.
func getReadyz(url string, bound time.Duration) readyz {
	c := &http.Client{Timeout: bound}
	resp, err := c.Get(url)
	if err != nil {
		return readyz{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return readyz{code: resp.StatusCode, body: string(b), err: err}
}

// A broker that accepts connections and never answers: /readyz answers every request at
// once from the background check, says Kafka is not ready, and the requests do not open
// connections of their own (one check at a time opens one).
func TestReadyzHungBroker(t *testing.T) {
	broker := startHungBroker(t)
	kc := kafkax.Config{Brokers: []string{broker.ln.Addr().String()}}
	kc = kc.WithDefaults()
	url := startTestAdmin(t, kc)

	const requests, parallel = 40, 8
	const bound = 10 * time.Second
	results := make(chan readyz, requests)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for range requests {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results <- getReadyz(url, bound)
		}()
	}
	wg.Wait()
	close(results)
	unanswered := 0
	for r := range results {
		if r.err != nil {
			unanswered++
			continue
		}
		if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "kafka: ") || strings.Contains(r.body, "kafka: ok") {
			t.Fatalf("/readyz = %d %q, want 503 with kafka not ready", r.code, r.body)
		}
	}
	if unanswered > 0 {
		t.Fatalf("%d of %d /readyz requests not answered within %s; %d connections to the broker", unanswered, requests, bound, broker.accepted())
	}

	// Once the check has timed out, the answer says so.
	var last readyz
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if last = getReadyz(url, bound); last.err == nil && strings.Contains(last.body, "kafka: failed") {
			break
		}
	}
	if last.err != nil || last.code != http.StatusServiceUnavailable || !strings.Contains(last.body, "kafka: failed") || !strings.Contains(last.body, "database: ok") {
		t.Fatalf("/readyz = %d %q (%v), want 503 with kafka failed and database ok", last.code, last.body, last.err)
	}
	if strings.Contains(last.body, broker.ln.Addr().String()) {
		t.Errorf("/readyz shows internal error text: %q", last.body)
	}
	// At most one check in flight, a few seconds apart: a handful of connections however
	// many requests came.
	if n := broker.accepted(); n > 4 {
		t.Fatalf("%d connections to the broker for %d /readyz requests, want a few at most", n, requests+1)
	} else {
		t.Logf("%d connection(s) to the hung broker for %d+ /readyz requests; last answer %q", n, requests, last.body)
	}
}

// With MariaDB and Kafka up, /readyz turns ready.
func TestReadyzReady(t *testing.T) {
	kc := testenv.Kafka(t)
	url := startTestAdmin(t, kc)
	var last readyz
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if last = getReadyz(url, 10*time.Second); last.err == nil && last.code == http.StatusOK {
			break
		}
	}
	if last.err != nil || last.code != http.StatusOK || !strings.Contains(last.body, "kafka: ok") || !strings.Contains(last.body, "database: ok") {
		t.Fatalf("/readyz = %d %q (%v), want 200 with kafka and database ok", last.code, last.body, last.err)
	}
}

// The subscriber `run` builds reports partition stats (and so feeds the consumer gauges)
// with kafka.window > 1 only.
func TestSubscriberPartitionStats(t *testing.T) {
	kc := kafkax.Config{}
	kc = kc.WithDefaults()
	for _, tc := range []struct {
		window int
		want   bool
	}{{1024, true}, {1, false}} {
		a := &Setup{Config: Config{Kafka: KafkaConfig{Parallel: kafkax.ParallelConfig{Window: tc.window}}}, logger: watermill.NopLogger{}}
		sub, err := a.subscriber(kc, "g", kafkax.NewBudget(1<<20))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := sub.(metrics.PartitionStatsSource); ok != tc.want {
			t.Errorf("kafka.window %d: partition stats %v, want %v", tc.window, ok, tc.want)
		}
		_ = sub.Close()
	}
}

// /metrics shows a claimed partition's lag, messages in flight and the age of the oldest.
func TestMetricsConsumerGauges(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "admin-gauges", 1)
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	group := "admin-gauges-" + topic
	sub, err := kc.NewParallelSubscriber(group, kafkax.ParallelConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case <-ch: // held, never acked
		case <-time.After(30 * time.Second):
			t.Fatal("nothing received")
		}
	}
	m := metrics.New(nil)
	m.Consumers.Add(sub)
	url := startTestAdminWith(t, kc, m) + "/metrics"
	labels := fmt.Sprintf(`{group="%s",partition="0",topic="%s"}`, group, topic)
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		if strings.Contains(body, "onceflow_consumer_lag_messages"+labels+" 3") {
			break
		}
	}
	for _, want := range []string{"onceflow_consumer_lag_messages" + labels + " 3", "onceflow_consumer_in_flight" + labels + " 3",
		"onceflow_consumer_oldest_unacked_seconds" + labels + " "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "onceflow_consumer_oldest_unacked_seconds"+labels+" 0\n") {
		t.Errorf("oldest un-acked age is 0 with 3 messages in flight")
	}
}

// admin.pprof serves the runtime's profiles on the admin listener; off (the default) it
// serves none.
func TestAdminPprof(t *testing.T) {
	testenv.Integration(t)
	kc := kafkax.Config{Brokers: []string{startHungBroker(t).ln.Addr().String()}}
	for _, on := range []bool{false, true} {
		d := testenv.DB(t, 2)
		addr := freeAddr(t)
		a := &Setup{Config: Config{Admin: AdminConfig{Listen: addr, Pprof: on}}, logger: watermill.NopLogger{}}
		ctx, cancel := context.WithCancel(context.Background())
		stop, err := a.startAdmin(ctx, d.DB, kc, metrics.New(nil))
		if err != nil {
			t.Fatal(err)
		}
		for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/heap?debug=1": "heap profile", "/debug/pprof/profile?seconds=1": "", "/debug/pprof/trace?seconds=1": ""} {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			served := resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) && !strings.Contains(string(body), "<html")
			if path == "/debug/pprof/" {
				served = resp.StatusCode == http.StatusOK && strings.Contains(string(body), want)
			}
			if served != on {
				t.Errorf("admin.pprof=%v: GET %s: %d, %.80q", on, path, resp.StatusCode, body)
			}
		}
		cancel()
		stop()
	}
}

// /metrics reports each /readyz check as onceflow_ready{check}: with a broker that never
// answers, database 1 and kafka 0 once the kafka check has timed out.
func TestMetricsReadiness(t *testing.T) {
	broker := startHungBroker(t)
	kc := kafkax.Config{Brokers: []string{broker.ln.Addr().String()}}
	kc = kc.WithDefaults()
	url := startTestAdminWith(t, kc, metrics.New(nil)) + "/metrics"
	want := []string{`onceflow_ready{check="database"} 1`, `onceflow_ready{check="kafka"} 0`}
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if r := getReadyz(url, 10*time.Second); r.err == nil {
			body = r.body
		}
		if strings.Contains(body, want[0]+"\n") {
			break
		}
	}
	for _, w := range want {
		if !strings.Contains(body, w+"\n") {
			t.Errorf("/metrics has no line %s:\n%s", w, grepLines(body, "onceflow_ready"))
		}
	}
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

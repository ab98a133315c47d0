package onceflow_test

import (
	"compress/gzip"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/internal/tracex"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// echoer is a plugin that writes each delivery's key as an event to its out topic, through
// the outbox.
type echoer struct {
	w   *outbox.Writer
	out string
}

func (h echoer) Decode(m *message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{Key: string(m.Payload)}, nil
}

func (h echoer) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	return inbox.Done, h.w.Add(ctx, tx, outbox.Event{ID: d.Key, Type: "Echoed", Topic: h.out, Key: d.Key, Payload: []byte(d.Key)})
}

func echoerPlugin(in, out string) inbox.Plugin {
	return inbox.Plugin{
		Name: "echo", Topics: []string{in}, ConsumerGroup: "echo-" + in, BizType: "echo",
		Writes: func(any) ([]string, error) { return []string{out}, nil },
		Build: func(context.Context, inbox.PluginEnv) (inbox.Handler, error) {
			w, err := outbox.NewWriter("")
			return echoer{w: w, out: out}, err
		},
	}
}

// collector is an OTLP/HTTP trace receiver: it keeps every span it is sent, by its hex trace
// id, and the service names of their resources.
type collector struct {
	mu       sync.Mutex
	spans    map[string][]*tracepb.Span
	services map[string]bool
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	b, err := io.ReadAll(body)
	var req collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				c.services[a.GetValue().GetStringValue()] = true
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				id := hex.EncodeToString(s.TraceId)
				c.spans[id] = append(c.spans[id], s)
			}
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// names lists the names of the spans of trace id, and their kinds by name.
func (c *collector) names(id string) map[string]tracepb.Span_SpanKind {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]tracepb.Span_SpanKind{}
	for _, s := range c.spans[id] {
		out[s.Name] = s.Kind
	}
	return out
}

// otel.exporter: otlp, as `router run` runs it: the runtime exports its spans over
// OTLP/HTTP to otel.endpoint (a collector here), and a record's trace goes through the
// inbox, the outbox and the relay onto the published event. With otel.exporter none (the
// default) the same run exports nothing, and the event carries no traceparent.
func TestRunExportsTraces(t *testing.T) {
	for _, exporter := range []string{"otlp", "none"} {
		t.Run(exporter, func(t *testing.T) {
			d := testenv.DB(t, 8)
			kc := testenv.Kafka(t)
			in := testenv.Topic(t, kc, "echo-in", 2)
			out := testenv.Topic(t, kc, "echo-out", 2)
			reg := []inbox.Plugin{echoerPlugin(in, out)}
			col := &collector{spans: map[string][]*tracepb.Span{}, services: map[string]bool{}}
			srv := httptest.NewServer(col)
			defer srv.Close()
			cfgFile := filepath.Join(t.TempDir(), "router.yaml")
			body := fmt.Sprintf(`db:
  dsn: %q
kafka:
  brokers: [%q]
admin:
  listen: ''
relay:
  transactional_id: %q
otel:
  exporter: %s
  endpoint: %q
`, d.DSN, kc.Brokers[0], "test-"+in, exporter, srv.URL)
			if err := os.WriteFile(cfgFile, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}

			// Three records, each in a trace of its own.
			traces := map[string]string{} // key → trace id
			p, err := kc.NewSyncProducer()
			if err != nil {
				t.Fatal(err)
			}
			var msgs []*sarama.ProducerMessage
			for i := range 3 {
				key := fmt.Sprintf("%s-%d", exporter, i)
				var tid [16]byte
				var sid [8]byte
				_, _ = rand.Read(tid[:])
				_, _ = rand.Read(sid[:])
				traces[key] = hex.EncodeToString(tid[:])
				msgs = append(msgs, &sarama.ProducerMessage{Topic: in, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(key),
					Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())},
						{Key: []byte(tracex.Header), Value: []byte("00-" + traces[key] + "-" + hex.EncodeToString(sid[:]) + "-01")}}})
			}
			if err := p.SendMessages(msgs); err != nil {
				t.Fatal(err)
			}
			_ = p.Close()

			// What `router --config cfgFile run` runs, with the test's plugins.
			s, err := onceflow.LoadSetup(onceflow.Source{File: cfgFile}, reg)
			if err != nil {
				t.Fatal(err)
			}
			ps, err := s.Plugins()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			runErr := make(chan error, 1)
			go func() { runErr <- s.Runtime(ps).Run(ctx) }()
			var recs []kafkax.Record
			waitFor(t, "three events on "+out, func() bool {
				recs, err = kc.ReadAll(context.Background(), out, 500*time.Millisecond)
				return err == nil && len(recs) == 3
			})
			cancel() // run stops the router and the relay, then flushes its spans
			select {
			case err := <-runErr:
				if err != nil {
					t.Fatalf("run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("run did not stop")
			}

			for _, r := range recs {
				sc, traced := tracex.Parse(r.Headers[tracex.Header])
				if exporter == "none" {
					if traced {
						t.Errorf("event %s carries traceparent %s with tracing off", r.Key, r.Headers[tracex.Header])
					}
					continue
				}
				if !traced || sc.TraceID().String() != traces[r.Key] {
					t.Errorf("event %s: traceparent %q, want trace %s", r.Key, r.Headers[tracex.Header], traces[r.Key])
					continue
				}
				names := col.names(traces[r.Key])
				for name, kind := range map[string]tracepb.Span_SpanKind{
					"process " + in: tracepb.Span_SPAN_KIND_CONSUMER, "inbox handle": tracepb.Span_SPAN_KIND_INTERNAL,
					"send " + out: tracepb.Span_SPAN_KIND_PRODUCER,
				} {
					if k, ok := names[name]; !ok || k != kind {
						t.Errorf("trace %s (event %s): no %s span %q exported; spans %v", traces[r.Key], r.Key, kind, name, names)
					}
				}
			}
			col.mu.Lock()
			defer col.mu.Unlock()
			switch {
			case exporter == "none" && len(col.spans) > 0:
				t.Errorf("tracing off, yet %d traces were exported", len(col.spans))
			case exporter == "otlp" && !col.services["onceflow-router"]:
				t.Errorf("exported resources name services %v, want onceflow-router", col.services)
			}
			if n := strings.Count(body, "otel:"); n != 1 {
				t.Fatalf("config has %d otel sections", n)
			}
		})
	}
}

package onceflow

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// A new trace is recorded when one of its links is (a batch's span linked to a sampled
// delivery), else at the ratio; a parent's decision still wins under ParentBased.
func TestLinkedSampler(t *testing.T) {
	s := sdktrace.ParentBased(linkedSampler{sdktrace.TraceIDRatioBased(0)})
	link := func(sampled bool) trace.Link {
		c := trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}}
		if sampled {
			c.TraceFlags = trace.FlagsSampled
		}
		return trace.Link{SpanContext: trace.NewSpanContext(c)}
	}
	decide := func(parent context.Context, links ...trace.Link) sdktrace.SamplingDecision {
		return s.ShouldSample(sdktrace.SamplingParameters{ParentContext: parent, TraceID: trace.TraceID{2}, Name: "x", Links: links}).Decision
	}
	bg := context.Background()
	if d := decide(bg); d != sdktrace.Drop {
		t.Errorf("ratio 0, no links: %v, want drop", d)
	}
	if d := decide(bg, link(false), link(true)); d != sdktrace.RecordAndSample {
		t.Errorf("a sampled link: %v, want sampled", d)
	}
	if d := decide(bg, link(false)); d != sdktrace.Drop {
		t.Errorf("unsampled links only: %v, want drop", d)
	}
	unsampledParent := trace.ContextWithRemoteSpanContext(bg, link(false).SpanContext)
	if d := decide(unsampledParent, link(true)); d != sdktrace.Drop {
		t.Errorf("an unsampled parent: %v, want its decision (drop)", d)
	}
}

// Bad otel.* values are bad input, one line naming the key, before anything connects.
func TestOtelSettings(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range []struct{ yaml, want string }{
		{"otel:\n  exporter: zipkin\n", `otel.exporter "zipkin": use none or otlp`},
		{"otel:\n  exporter: otlp\n  endpoint: 127.0.0.1:4318\n", `otel.endpoint "127.0.0.1:4318"`},
		{"otel:\n  endpoint: ftp://collector\n", `otel.endpoint "ftp://collector"`},
		{"otel:\n  endpoint: https://user:secret@collector\n", `without credentials`},
		{"otel:\n  exporter: otlp\n  endpoint: https://collector.example:4318/v1/traces\n  sample_ratio: 0.25\n", ""},
	} {
		p := filepath.Join(dir, string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		err := runRouter(context.Background(), p, "plugins")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want accepted", tc.yaml, err)
		case tc.want == "":
		case err == nil || !isBadInput(err) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
			t.Errorf("%q: %v (bad input: %t), want bad input with %q on one line", tc.yaml, err, isBadInput(err), tc.want)
		}
	}
}

package onceflow

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// OtelConfig is otel.*, the tracing settings. Tracing is off unless Exporter is otlp.
type OtelConfig struct {
	Exporter    string  `key:"exporter" default:"none" help:"tracing: none (no span is created) or otlp (OpenTelemetry spans over OTLP/HTTP from \x60run\x60 and \x60relay\x60: a delivery continues its record's traceparent header, the outbox keeps the trace, the relay writes it on the event; docs/ARCHITECTURE.md, Tracing)"`
	Endpoint    string  `key:"endpoint" help:"OTLP/HTTP collector URL, e.g. http://127.0.0.1:4318 (/v1/traces added when it has no path; https: verified with the system's CAs); empty: the OTEL_EXPORTER_OTLP_* environment, else https://localhost:4318"`
	SampleRatio float64 `key:"sample_ratio" default:"1" range:"0..1" help:"share of new traces recorded, 0..1; a record whose traceparent says sampled (or not) decides for its own trace"`
}

func (c OtelConfig) validate() error {
	switch c.Exporter {
	case "none", "otlp":
	default:
		return fmt.Errorf("otel.exporter %q: use none or otlp", c.Exporter)
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return fmt.Errorf("otel.endpoint %q: want the collector's http:// or https:// URL without credentials, e.g. http://127.0.0.1:4318", c.Endpoint)
		}
	}
	return nil
}

// startTracing builds the tracer provider of otel.* into s.Config. Inboxes and relays built
// afterwards trace with it. With otel.exporter none it builds nothing, so nothing is traced
// and no span is ever created. With otlp, an SDK provider exports spans in batches over
// OTLP/HTTP to otel.endpoint. It samples new traces at otel.sample_ratio, and follows a
// parent's decision for the others. It becomes the process's global provider and
// propagator, so a plugin's own spans from otel.Tracer join its handler's trace. The
// service name is onceflow-router unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say
// otherwise. The exporter reads its other OTEL_EXPORTER_OTLP_* settings, such as headers
// and timeout, from the environment. The returned func flushes the spans still queued and
// shuts the provider down. Call it once the traced parts have stopped.
func (s *Setup) startTracing(ctx context.Context) (func(), error) {
	c := s.Config.Otel
	if c.Exporter != "otlp" {
		return func() {}, nil
	}
	var opts []otlptracehttp.Option
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint) // checked by validate
		if err != nil {
			return nil, BadInput(fmt.Errorf("otel.endpoint: %w", err))
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces" // a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, BadInput(fmt.Errorf("otel: %w", err))
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "onceflow-router")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, BadInput(fmt.Errorf("otel: resource: %w", err))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(linkedSampler{sdktrace.TraceIDRatioBased(c.SampleRatio)})))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	s.Config.tracing = tp
	s.logger.Info("tracing on", watermill.LogFields{"exporter": "otlp", "endpoint": c.Endpoint, "sample_ratio": c.SampleRatio})
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			s.logger.Error("tracing: spans not exported at shutdown", err, nil)
		}
		s.Config.tracing = nil
	}, nil
}

// tracing is the part that builds the tracer provider of otel.* with startTracing. Stopping
// it flushes the spans still queued. Parts stop in reverse order, so by then the parts
// started after it have stopped.
func (s *Setup) tracing() part {
	var stop func()
	return part{name: "tracing",
		start: func(ctx context.Context) (err error) {
			stop, err = s.startTracing(ctx)
			return err
		},
		stop: func() { stop() },
	}
}

// linkedSampler decides for a new trace, which is a span without a parent. The span is
// sampled when one of its links is, and else by ratio. A group-committed batch's span
// starts a trace linked to its deliveries' spans. So the batch's span is recorded whenever
// one of theirs is, and a sampled delivery's link to its batch never points at a span that
// was dropped.
type linkedSampler struct{ ratio sdktrace.Sampler }

func (s linkedSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	for _, l := range p.Links {
		if l.SpanContext.IsSampled() {
			return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
		}
	}
	return s.ratio.ShouldSample(p)
}

func (s linkedSampler) Description() string {
	return "LinkedOr{" + s.ratio.Description() + "}"
}

package onceflow

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
)

// TestLevelGate: below the logger's level, Debug and Trace cost no allocation (Watermill's
// own adapter converts the fields first: it allocates); at their level they are written,
// with the fields of With.
func TestLevelGate(t *testing.T) {
	fields := watermill.LogFields{"message_uuid": "u", "topic": "t", "handler": "h"}
	var buf bytes.Buffer
	info := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	gated, plain := gateLevels(info), watermill.NewSlogLogger(info)
	if n := testing.AllocsPerRun(100, func() { gated.Trace("received", fields); gated.Debug("received", fields) }); n != 0 {
		t.Errorf("gated Trace and Debug below the level: %.0f allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { plain.Trace("received", fields) }); n == 0 {
		t.Error("Watermill's adapter alone allocated nothing: the gate's check proves nothing")
	}
	if buf.Len() != 0 {
		t.Fatalf("wrote below the level: %q", buf.String())
	}
	trace := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: watermill.LevelTrace}))
	g := gateLevels(trace).With(watermill.LogFields{"plugin": "p"})
	g.Trace("traced", fields)
	g.Debug("debugged", nil)
	g.Info("told", nil)
	for _, want := range []string{"msg=traced", "topic=t", "plugin=p", "msg=debugged", "msg=told"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
}

// Warn writes at slog's WARN level, with the fields of With, and nothing below the logger's
// level.
func TestLevelGateWarn(t *testing.T) {
	var buf bytes.Buffer
	warnOnly := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g := gateLevels(warnOnly).With(watermill.LogFields{"plugin": "p"})
	w, ok := g.(interface {
		Warn(string, watermill.LogFields)
	})
	if !ok {
		t.Fatal("the router's logger has no Warn method")
	}
	g.Info("told", nil)
	w.Warn("warned", watermill.LogFields{"shard": "s"})
	if want := "level=WARN msg=warned plugin=p shard=s\n"; !strings.HasSuffix(buf.String(), want) || strings.Contains(buf.String(), "told") {
		t.Fatalf("log %q, want only the warning, ending %q", buf.String(), want)
	}
	buf.Reset()
	gateLevels(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))).(interface {
		Warn(string, watermill.LogFields)
	}).Warn("warned", nil)
	if buf.Len() != 0 {
		t.Fatalf("a warning below the level was written: %q", buf.String())
	}
}

package onceflow

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"slices"

	"github.com/ThreeDotsLabs/watermill"
)

// newLogger is the logger of c. It is slog's text or JSON handler on stderr at c.Level,
// behind Watermill's adapter.
func newLogger(c LogConfig) watermill.LoggerAdapter {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if c.Format == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	return gateLevels(slog.New(h))
}

// gateLevels is Watermill's adapter of l behind a levelGate.
func gateLevels(l *slog.Logger) watermill.LoggerAdapter {
	return levelGate{LoggerAdapter: watermill.NewSlogLogger(l), l: l}
}

// levelGate drops Debug and Trace messages below the logger's level. Watermill's slog
// adapter turns a message's fields into attributes before it asks whether the level is on.
// Watermill's router logs every message at Trace, so each message would cost an allocation
// for nothing.
type levelGate struct {
	watermill.LoggerAdapter
	l *slog.Logger
}

func (g levelGate) Debug(msg string, fields watermill.LogFields) {
	if g.l.Enabled(context.Background(), slog.LevelDebug) {
		g.LoggerAdapter.Debug(msg, fields)
	}
}

func (g levelGate) Trace(msg string, fields watermill.LogFields) {
	if g.l.Enabled(context.Background(), watermill.LevelTrace) {
		g.LoggerAdapter.Trace(msg, fields)
	}
}

// Warn logs msg at slog's WARN level, with the fields of With. Watermill's adapter lacks
// that level. The outbox relay looks for a Warn method.
func (g levelGate) Warn(msg string, fields watermill.LogFields) {
	if g.l.Enabled(context.Background(), slog.LevelWarn) {
		g.l.Warn(msg, slogArgs(fields)...)
	}
}

func (g levelGate) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return levelGate{LoggerAdapter: g.LoggerAdapter.With(fields), l: g.l.With(slogArgs(fields)...)}
}

// slogArgs are fields as slog's key-value arguments, in key order.
func slogArgs(fields watermill.LogFields) []any {
	keys := slices.Sorted(maps.Keys(fields))
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, k, fields[k])
	}
	return args
}

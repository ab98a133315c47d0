package console

import (
	"slices"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/consoleui"
)

// TestConsoleKeyCandidates checks that what the console shows of a key, typed back as a
// filter, finds the key.
func TestConsoleKeyCandidates(t *testing.T) {
	for _, key := range []string{"plain", "a\x1b[31mb", "x\u202ey", `has\backslash`, `q"uote`} {
		if !slices.Contains(keyCandidates(consoleui.Visible(key)), key) {
			t.Errorf("keyCandidates(Visible(%q)) = %q: the key is not among them", key, keyCandidates(consoleui.Visible(key)))
		}
	}
	if keyCandidates("") != nil {
		t.Error("keyCandidates of nothing")
	}
}

func TestConsoleParseWhen(t *testing.T) {
	now := time.Date(2026, 11, 11, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2h":                   now.Add(-2 * time.Hour),
		"30m ago":              now.Add(-30 * time.Minute),
		"2026-11-11T08:00:00Z": now.Add(-2 * time.Hour),
		"2026-11-11 08:00":     now.Add(-2 * time.Hour),
		"2026-11-11":           now.Add(-10 * time.Hour),
	} {
		if got, err := consoleParseWhen("since", in, now); err != nil || !got.Equal(want) {
			t.Errorf("consoleParseWhen(%q) = %v %v, want %v", in, got, err, want)
		}
	}
	if _, err := consoleParseWhen("since", "yesterday", now); err == nil {
		t.Error("consoleParseWhen accepted yesterday")
	}
}

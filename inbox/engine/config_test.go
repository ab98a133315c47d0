package engine_test

import (
	"testing"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/settings"
)

// TestMaxPayloadLimitIsTheRange checks that the top of inbox.max_payload_bytes' range is
// the payload column's size, MaxPayloadLimit.
func TestMaxPayloadLimitIsTheRange(t *testing.T) {
	for _, s := range settings.List(engine.Config{}) {
		if s.Key == "max_payload_bytes" {
			if s.Max != any(engine.MaxPayloadLimit) {
				t.Fatalf("range top %v, MaxPayloadLimit %d", s.Max, engine.MaxPayloadLimit)
			}
			return
		}
	}
	t.Fatal("no max_payload_bytes setting")
}

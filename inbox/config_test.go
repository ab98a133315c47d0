package inbox_test

import (
	"testing"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/settings"
)

// TestMaxPayloadLimitIsTheRange checks that the top of inbox.max_payload_bytes' range is
// the payload column's size, MaxPayloadLimit.
func TestMaxPayloadLimitIsTheRange(t *testing.T) {
	for _, s := range settings.List(inbox.Config{}) {
		if s.Key == "max_payload_bytes" {
			if s.Max != any(inbox.MaxPayloadLimit) {
				t.Fatalf("range top %v, MaxPayloadLimit %d", s.Max, inbox.MaxPayloadLimit)
			}
			return
		}
	}
	t.Fatal("no max_payload_bytes setting")
}

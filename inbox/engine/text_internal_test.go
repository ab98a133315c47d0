package engine

import (
	"encoding/json"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TestMetadataJSONEmpty checks that no metadata is stored as json.Marshal writes it,
// without allocating.
func TestMetadataJSONEmpty(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   message.Metadata
		max  int
	}{
		{name: "nil", md: nil, max: 1000},
		{name: "empty", md: message.Metadata{}, max: 1000},
		{name: "empty at the smallest limit", md: message.Metadata{}, max: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, _ := json.Marshal(tc.md)
			got, ok := metadataJSON(tc.md, tc.max)
			if !ok || got != string(want) {
				t.Errorf("metadataJSON = %q, %v; want %q, true", got, ok, want)
			}
			if a := testing.AllocsPerRun(100, func() { metadataJSON(tc.md, tc.max) }); a != 0 {
				t.Errorf("%.0f allocations, want 0", a)
			}
		})
	}
}

// TestClaimedColumnsInPlace checks that the claimed rows' columns read in place give what
// reading them as strings gives. Reading them allocates nothing for the delivery's own
// fingerprint or for a known status.
func TestClaimedColumnsInPlace(t *testing.T) {
	for _, tc := range []struct {
		stored, want string
	}{
		{stored: "abc", want: "abc"},
		{stored: "abc   ", want: "abc"}, // CHAR padding (PostgreSQL)
		{stored: "abd", want: "abc"},
		{stored: "", want: ""},
		{stored: "\xff ", want: "\xff"}, // bytes as stored, never rewritten
	} {
		if got := storedFingerprintOf([]byte(tc.stored), tc.want); got != storedFingerprint(tc.stored) {
			t.Errorf("storedFingerprintOf(%q, %q) = %q, want %q", tc.stored, tc.want, got, storedFingerprint(tc.stored))
		}
		b := []byte(tc.stored)
		if storedFingerprint(tc.stored) != tc.want {
			continue
		}
		if a := testing.AllocsPerRun(100, func() { sink = storedFingerprintOf(b, tc.want) }); a != 0 {
			t.Errorf("storedFingerprintOf(%q, %q): %.0f allocations, want 0", tc.stored, tc.want, a)
		}
	}
	for _, s := range []Status{StatusProcessing, StatusDone, StatusFailed, "other"} {
		b := []byte(s)
		if got := statusOf(b); got != s {
			t.Errorf("statusOf(%q) = %q", s, got)
		}
		if s == "other" {
			continue
		}
		if a := testing.AllocsPerRun(100, func() { sink = string(statusOf(b)) }); a != 0 {
			t.Errorf("statusOf(%q): %.0f allocations, want 0", s, a)
		}
	}
}

var sink string // keeps a result on the heap, as a stored row's is

package kafkax

import (
	"slices"
	"strings"
	"testing"
)

func TestAckedMetadataRoundTrip(t *testing.T) {
	runs := []ackedRange{{11, 11}, {13, 20}, {1 << 40, 1<<40 + 5}}
	md := encodeAcked(10, runs)
	if !strings.HasPrefix(md, ackedPrefix+"10:") {
		t.Fatalf("metadata %q", md)
	}
	if got := decodeAcked(md, 10); !slices.Equal(got, runs) {
		t.Fatalf("decoded %v, want %v", got, runs)
	}
	// Written with another offset, or not by this package: nothing is skipped.
	for _, other := range []struct {
		md     string
		offset int64
	}{
		{md, 11}, {md, 9}, {"", 10}, {"someone else's", 10}, {ackedPrefix + "10:!!", 10},
		{ackedPrefix + "10", 10}, {ackedPrefix + "10:AA", 10}, // a run of length 0
	} {
		if got := decodeAcked(other.md, other.offset); got != nil {
			t.Errorf("decodeAcked(%q, %d) = %v, want nil", other.md, other.offset, got)
		}
	}
	if md := encodeAcked(10, nil); md != "" {
		t.Fatalf("no runs: %q", md)
	}
}

// TestAckedMetadataBounded checks that runs past ackedMetadataMax are left out, from the
// last, so Kafka never refuses the commit, and that those kept decode as written.
func TestAckedMetadataBounded(t *testing.T) {
	var runs []ackedRange
	for i := int64(0); i < 5000; i++ {
		runs = append(runs, ackedRange{100 + 2*i + 1, 100 + 2*i + 1}) // every other offset
	}
	md := encodeAcked(100, runs)
	if len(md) > ackedMetadataMax {
		t.Fatalf("metadata of %d bytes, more than %d", len(md), ackedMetadataMax)
	}
	got := decodeAcked(md, 100)
	if len(got) < 500 || len(got) >= len(runs) || !slices.Equal(got, runs[:len(got)]) {
		t.Fatalf("kept %d runs of %d, want the first ones, at least 500", len(got), len(runs))
	}
}

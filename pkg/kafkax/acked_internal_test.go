package kafkax

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
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

// resetSession records the offsets and metadata a claim marks with ResetOffset.
type resetSession struct {
	sarama.ConsumerGroupSession
	resets []string
}

func (f *resetSession) ResetOffset(_ string, _ int32, offset int64, md string) {
	f.resets = append(f.resets, fmt.Sprintf("%d %q", offset, md))
}

// TestAckedMetadataRefused checks that once the broker refuses the metadata, every claim
// marks its offset again without it, and none is written or read from then on.
func TestAckedMetadataRefused(t *testing.T) {
	s := &ParallelSubscriber{logger: watermill.NopLogger{}, claims: map[*claimRun]struct{}{}}
	sess := &resetSession{}
	r := &claimRun{h: &parallelHandler{s: s}, sess: sess, topic: "t", marked: 10,
		queue: []*slot{{offset: 10}, {offset: 11, acked: true}, {offset: 12, acked: true}}}
	s.track(r)
	r.mu.Lock()
	r.markAckedLocked()
	r.mu.Unlock()
	want := fmt.Sprintf("10 %q", encodeAcked(10, []ackedRange{{11, 12}}))
	if len(sess.resets) != 1 || sess.resets[0] != want {
		t.Fatalf("marked %v, want [%s]", sess.resets, want)
	}
	s.refuseAcked(nil)
	s.refuseAcked(nil) // once is enough
	if len(sess.resets) != 2 || sess.resets[1] != `10 ""` {
		t.Fatalf("after the refusal marked %v, want the offset again with no metadata", sess.resets)
	}
	r.mu.Lock()
	r.noteAckedLocked()
	r.markAckedLocked()
	timer := r.ackedTimer
	r.mu.Unlock()
	if timer != nil || len(sess.resets) != 2 {
		t.Fatalf("metadata still noted or marked after the refusal: %v", sess.resets)
	}
	if got := (&parallelHandler{s: s, coord: nil}).committedAcked("t", 0, 10, nil); got != nil {
		t.Fatalf("read %v after the refusal", got)
	}
}

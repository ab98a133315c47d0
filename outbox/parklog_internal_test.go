package outbox

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// The relay writes one line per run of parked events, not one per event. 10,000 events of
// a missing topic parked in 20 batches within one window give one line at once and one
// summing up the rest when the window ends. Every event is counted by its reason.
func TestParkLogOneLinePerRun(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &parkLog{now: func() time.Time { return now }}
	logger := watermill.NewCaptureLogger()
	id := int64(0)
	batch := func(n int, topic, reason string) []parkEntry {
		out := make([]parkEntry, n)
		for i := range out {
			id++
			out[i] = parkEntry{row: outRow{id: id, eventID: fmt.Sprintf("ev-%d", id), topic: topic, key: fmt.Sprintf("k-%d", id)},
				reason: reason, err: "kafka refuses event ev-" + fmt.Sprint(id)}
		}
		return out
	}
	for range 20 {
		l.add(logger, batch(500, "gone", ReasonUnknownTopic), "")
		l.add(logger, batch(2, "gone", ReasonHeld), "")
		now = now.Add(100 * time.Millisecond)
		l.flush(logger, false)
	}
	errs := logger.Captured()[watermill.ErrorLogLevel]
	if len(errs) != 1 {
		t.Fatalf("%d error lines within the window, want 1", len(errs))
	}
	if f := errs[0].Fields; f["events"] != 500 || f["topic"] != "gone" || f["reason"] != ReasonUnknownTopic || f["first_id"] != int64(1) || f["last_id"] != int64(500) {
		t.Errorf("first line's fields %v, want 500 events of topic gone, ids 1..500", f)
	}
	now = now.Add(parkLogEvery)
	l.flush(logger, false)
	errs = logger.Captured()[watermill.ErrorLogLevel]
	if len(errs) != 2 || errs[1].Fields["events"] != 19*500 || errs[1].Fields["last_event_id"] != fmt.Sprintf("ev-%d", id-2) {
		t.Fatalf("after the window: %d error lines, the last %v; want 2, the second summing up 9500 events", len(errs), errs[len(errs)-1].Fields)
	}
	if infos := logger.Captured()[watermill.InfoLogLevel]; len(infos) != 2 || infos[0].Fields["events"] != 2 || infos[1].Fields["events"] != 38 {
		t.Errorf("held lines %v, want 2 lines of 2 and 38 events", infos)
	}
	now = now.Add(parkLogEvery)
	l.flush(logger, false)
	l.add(logger, batch(1, "gone", ReasonUnknownTopic), "")
	if n := len(logger.Captured()[watermill.ErrorLogLevel]); n != 3 {
		t.Errorf("a refusal after a quiet window: %d error lines, want it logged at once as a new run (3)", n)
	}
	l.add(logger, batch(1, "too-big", ReasonTooLarge), "")
	l.flush(logger, true)
	if got := l.parkedBy(); got[ReasonUnknownTopic] != 10001 || got[ReasonHeld] != 40 || got[ReasonTooLarge] != 1 {
		t.Errorf("parked by reason %v, want unknown_topic 10001, held 40, too_large 1", got)
	}
}

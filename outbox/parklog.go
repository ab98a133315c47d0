package outbox

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// parkLogEvery is the least time between two log lines of one run of parked events.
const parkLogEvery = 10 * time.Second

// parkReasons are the reasons the relay counts parked events by.
var parkReasons = [...]string{ReasonUnknownTopic, ReasonTooLarge, ReasonInvalidRecord, ReasonUnauthorized, ReasonHeld}

// parkLog counts and logs what the relay parks. It writes one line per run of parked
// events, not one per event. A run is the events of one shard, topic and reason parked
// without a pause of parkLogEvery. Its first batch is logged at once, and what follows is
// summed into at most one line per parkLogEvery.
type parkLog struct {
	counts [len(parkReasons)]atomic.Int64
	now    func() time.Time

	mu   sync.Mutex
	runs map[parkRunKey]*parkRun
}

type parkRunKey struct{ shard, topic, reason string }

// parkRun is what a run parked since its last line.
type parkRun struct {
	count                 int
	firstID, lastID       int64
	firstEvent, lastEvent string
	err                   string // the refusal of the run's first event since its last line
	logged                time.Time
}

// add counts moved, the rows park moved, and logs the runs they start or that are due.
func (l *parkLog) add(logger watermill.LoggerAdapter, moved []parkEntry, shard string) {
	if len(moved) == 0 {
		return
	}
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs == nil {
		l.runs = map[parkRunKey]*parkRun{}
	}
	var touched []parkRunKey
	for _, e := range moved {
		for i, r := range parkReasons {
			if r == e.reason {
				l.counts[i].Add(1)
			}
		}
		k := parkRunKey{shard, e.row.topic, e.reason}
		run := l.runs[k]
		if run == nil {
			run = &parkRun{}
			l.runs[k] = run
		}
		if run.count == 0 {
			run.firstID, run.firstEvent, run.err = e.row.id, e.row.eventID, e.err
			touched = append(touched, k)
		}
		run.count++
		run.lastID, run.lastEvent = e.row.id, e.row.eventID
	}
	for _, k := range touched {
		if run := l.runs[k]; run.logged.IsZero() || now.Sub(run.logged) >= parkLogEvery {
			l.write(logger, k, run, now)
		}
	}
}

// flush logs the runs whose next line is due, or with all every run that parked since its
// last line. It forgets the runs that ended.
func (l *parkLog) flush(logger watermill.LoggerAdapter, all bool) {
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, run := range l.runs {
		due := now.Sub(run.logged) >= parkLogEvery
		switch {
		case run.count > 0 && (all || due):
			l.write(logger, k, run, now)
		case run.count == 0 && due:
			delete(l.runs, k)
		}
	}
}

// write logs what run parked since its last line. l.mu is held.
func (l *parkLog) write(logger watermill.LoggerAdapter, k parkRunKey, run *parkRun, now time.Time) {
	fields := watermill.LogFields{"events": run.count, "topic": k.topic, "reason": k.reason,
		"first_id": run.firstID, "last_id": run.lastID, "first_event_id": run.firstEvent, "last_event_id": run.lastEvent}
	if k.shard != "" {
		fields["shard"] = k.shard
	}
	if k.reason == ReasonHeld {
		logger.Info("outbox events held behind parked events of their keys (released with them: router outbox retry|drop)", fields)
	} else {
		logger.Error("outbox events PARKED: Kafka refuses them for good; later events of their keys wait behind them (router outbox ls, retry, drop)",
			errors.New(run.err), fields)
	}
	*run = parkRun{logged: now}
}

func (l *parkLog) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// parkedBy returns how many events were parked with each reason.
func (l *parkLog) parkedBy() map[string]int64 {
	out := make(map[string]int64, len(parkReasons))
	for i, r := range parkReasons {
		out[r] = l.counts[i].Load()
	}
	return out
}

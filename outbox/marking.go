package outbox

import (
	"context"
	"fmt"
	"time"
)

// markJob is a batch's database mark running in the background, for pipelined batches.
type markJob struct {
	ids  []int64
	seq  int64
	done chan struct{}
	err  error
}

// markBatch marks a committed batch's rows, retrying a little, and closes m.done.
func (e *eosShard) markBatch(ctx context.Context, m *markJob) {
	defer close(m.done)
	// A ctx cancelled by shutdown must not skip the mark.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	e.r.hook("before-mark")
	for attempt := 0; attempt < 3; attempt++ {
		if m.err = e.mark(mctx, m.ids); m.err == nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	if m.err != nil {
		m.err = fmt.Errorf("batch %d is committed to Kafka, marking failed (reconciled by the next session): %w", m.seq, m.err)
		return
	}
	e.r.hook("after-mark")
	e.r.batches.Add(1)
	e.r.published.Add(int64(len(m.ids)))
}

// collect waits for the previous batch's mark and returns its error.
func (e *eosShard) collect() error {
	s := e.sess
	m := s.marking
	if m == nil {
		return nil
	}
	<-m.done
	s.marking = nil
	return m.err // an error ends the session
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (e *eosShard) mark(ctx context.Context, ids []int64) error {
	cond, args, _ := e.r.dl.idMatch(ids)
	query := e.r.dl.Rebind(e.r.q.markPrefix + cond + " AND published_at IS NULL")
	if _, err := e.r.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("mark %d outbox rows published: %w", len(ids), err)
	}
	return nil
}

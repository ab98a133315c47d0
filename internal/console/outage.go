package console

import (
	"time"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/metrics"
)

// outageRow is one biz type's line of the overview's dependencies block. It shows the biz
// type's circuit breaker in this process and its rows waiting for a delayed redelivery.
type outageRow struct {
	BizType string
	Breaker string    // closed, open or half-open, or "" when this process runs no breaker for it
	Since   time.Time // when the breaker entered its state, zero when it has been closed since the start
	ProbeAt time.Time // when a probe of an open breaker may run
	Delayed int64
	Next    time.Time // the earliest next attempt of a delayed row
	// LastError is the error of the last failure the breaker counted. For an open breaker
	// it is what opened it.
	LastError string
}

// outageRows are the rows of the biz types that have a breaker in this process or delayed
// rows. There are none when no biz type has either.
func (c *Console) outageRows(stats metrics.DBStats) []outageRow {
	by := map[string]*outageRow{}
	var out []*outageRow
	row := func(biz string) *outageRow {
		if r, ok := by[biz]; ok {
			return r
		}
		r := &outageRow{BizType: biz}
		by[biz] = r
		out = append(out, r)
		return r
	}
	if c.cfg.Metrics != nil {
		for _, b := range c.cfg.Metrics.Breakers() {
			r := row(b.BizType)
			r.Breaker, r.Since, r.ProbeAt, r.LastError = engine.BreakerState(b.State).String(), b.Since, b.ProbeAt, b.LastError
		}
	}
	for _, d := range stats.Delayed {
		r := row(d.BizType)
		r.Delayed, r.Next = d.Rows, d.Next
	}
	rows := make([]outageRow, 0, len(out))
	for _, biz := range c.bizTypes(stats) {
		if r, ok := by[biz]; ok {
			rows = append(rows, *r)
			delete(by, biz)
		}
	}
	for _, r := range out { // a breaker of a biz type bizTypes does not list
		if _, ok := by[r.BizType]; ok {
			rows = append(rows, *r)
		}
	}
	return rows
}

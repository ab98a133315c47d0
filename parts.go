package onceflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"golang.org/x/sync/errgroup"
)

// part is one piece of a running process. `router run` and `router relay` are each a list
// of parts. runParts starts them in the order of the list and stops them in reverse order.
type part struct {
	name string
	// start builds the part and checks what it needs. When it fails, it first releases what
	// it took. Its error stops the parts started before it, and runParts returns it as it
	// is. A nil start does nothing.
	start func(ctx context.Context) error
	// run runs the part until its ctx ends, then returns nil. A return before its ctx ends
	// is a failure that stops the process, even a nil one. A part retries by itself what a
	// retry can fix. A nil run runs nothing.
	run func(ctx context.Context) error
	// stop releases what start took. It is called after run returned, or without run when a
	// later part failed to start. A nil stop does nothing.
	stop func()
}

// when returns pt when on is true, and otherwise a part of the same name that does nothing.
func when(on bool, pt part) part {
	if !on {
		return part{name: pt.name}
	}
	return pt
}

// errStoppedEarly is the failure of a part whose run returned before the part was stopped.
var errStoppedEarly = errors.New("stopped on its own while the process runs")

// runParts starts parts one after the other, then runs them all until ctx ends or a run
// fails, then stops them in reverse order. To stop a part, runParts ends the ctx of its run,
// waits for the run to return, then calls its stop. So a part runs on until every part
// after it has stopped. runParts returns nil once ctx ended. It returns a start's error as
// it is, and the first failure of a run prefixed with the name of its part.
func runParts(ctx context.Context, logger watermill.LoggerAdapter, parts []part) error {
	for i, p := range parts {
		if p.start == nil {
			continue
		}
		if err := p.start(ctx); err != nil {
			stopParts(parts[:i], nil)
			return err
		}
		logger.Debug("part started", watermill.LogFields{"part": p.name})
	}
	g, gctx := errgroup.WithContext(ctx)
	ends := make([]func(), len(parts)) // ends[i] ends the run of parts[i] and waits for it
	for i, p := range parts {
		if p.run == nil {
			continue
		}
		// Only the stop of the part ends its run, so a cancelled ctx stops the parts in order.
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		ends[i] = func() { cancel(); <-done }
		g.Go(func() error {
			defer close(done)
			err := p.run(rctx)
			if err == nil && rctx.Err() == nil {
				err = errStoppedEarly
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", p.name, err)
				logger.Error("part failed, stopping the process", err, watermill.LogFields{"part": p.name})
			}
			return err
		})
	}
	<-gctx.Done()
	stopParts(parts, ends)
	return g.Wait()
}

// stopParts stops parts in reverse order. For each part it calls ends[i] when there is one,
// then the part's stop.
func stopParts(parts []part, ends []func()) {
	for i := len(parts) - 1; i >= 0; i-- {
		if i < len(ends) && ends[i] != nil {
			ends[i]()
		}
		if parts[i].stop != nil {
			parts[i].stop()
		}
	}
}

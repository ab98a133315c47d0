// Package groupcommit forms batches of keyed items for a few workers. It is the collection
// half of a group commit. engine.Batcher and the bench's unsafe baseline share it. The
// baseline must collect exactly alike, so that the bench measures the inbox's overhead and
// nothing else.
package groupcommit

import (
	"sync"
	"time"
)

// Config is how batches are formed.
type Config struct {
	MaxSize int           // most items in one batch (> 0)
	Linger  time.Duration // how long a batch waits for more items once it has its first
	Workers int           // how many batches run at once (> 0)
}

// Collect reads items from queue into batches and runs each batch with run on one of
// cfg.Workers workers, until stop is closed.
//
// A batch waits cfg.Linger after its first item for more. It then runs if no other batch is
// running. If one is, it waits up to another cfg.Linger for that one to finish, and then
// runs on an idle worker. A full batch of MaxSize items runs as soon as a worker is idle. So
// at moderate load batches run one after another, each taking what arrived while the
// previous one ran. That makes one transaction where two workers, each with its own linger,
// would make two smaller ones. Under load every worker runs full batches. While the next
// batch is full and no worker is idle, Collect does not read queue, which backs up to its
// writers.
//
// An item whose key is in a running batch is held for a later batch. So two batches running
// at once never share a key, and items of one key that arrive together meet in one batch.
//
// Once stop or queue is closed, Collect lets the running batches finish. It returns the
// items it had taken but not run. It does not drain queue.
func Collect[T any](cfg Config, queue <-chan T, stop <-chan struct{}, key func(T) string, run func([]T)) (left []T) {
	work := make(chan []T)
	finished := make(chan []T, cfg.Workers) // never blocks: at most Workers batches are out
	var workers sync.WaitGroup
	for range cfg.Workers {
		workers.Go(func() {
			for batch := range work {
				run(batch)
				finished <- batch
			}
		})
	}
	idle := cfg.Workers
	running := map[string]int{} // items per key in running batches
	var next, held []T          // the batch being formed; items waiting for their key
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var (
		first  time.Time        // when next got its first item
		ticked <-chan time.Time // timer.C while a deadline of next is ahead, else nil
	)
	add := func(it T) {
		if running[key(it)] > 0 {
			held = append(held, it)
			return
		}
		next = append(next, it)
		if len(next) == 1 {
			first = time.Now()
			timer.Reset(cfg.Linger)
			ticked = timer.C
		}
	}
	// ready reports whether next should run now, given an idle worker. When it should not,
	// the timer is set for when it may.
	ready := func() bool {
		if len(next) >= cfg.MaxSize {
			return true
		}
		waited := time.Since(first)
		switch {
		case waited < cfg.Linger:
			return false // the timer is set for the linger
		case idle == cfg.Workers || waited >= 2*cfg.Linger:
			return true
		}
		if ticked == nil {
			timer.Reset(2*cfg.Linger - waited)
			ticked = timer.C
		}
		return false
	}
	defer func() {
		timer.Stop()
		close(work)
		workers.Wait()
		left = append(next, held...)
	}()
	for {
		if len(next) > 0 && idle > 0 && ready() {
			timer.Stop() // Go ≥ 1.23: no stale tick after Stop
			ticked = nil
			for _, it := range next {
				running[key(it)]++
			}
			idle--
			work <- next
			next = nil
		}
		in := queue
		if len(next) >= cfg.MaxSize {
			in = nil
		}
		select {
		case it, ok := <-in:
			if !ok {
				return // queue closed: as if stopped
			}
			add(it)
		case <-ticked:
			ticked = nil
		case batch := <-finished:
			idle++
			for _, it := range batch {
				k := key(it)
				if running[k]--; running[k] == 0 {
					delete(running, k)
				}
			}
			waiting := held
			held = nil
			for _, it := range waiting {
				if len(next) < cfg.MaxSize {
					add(it)
				} else {
					held = append(held, it)
				}
			}
		case <-stop:
			return
		}
	}
}

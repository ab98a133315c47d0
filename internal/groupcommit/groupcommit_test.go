package groupcommit_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/groupcommit"
)

type item struct {
	key string
	n   int
}

func keyOf(it item) string { return it.key }

// recorder is a run func that records batches and checks that no two running batches share
// a key. block, when newBlockedRecorder sets it, holds every run until release.
type recorder struct {
	mu        sync.Mutex
	running   map[string]int
	batches   [][]item
	conflicts []string
	maxSize   int
	active    int
	maxActive int
	started   chan int // receives the batch's index as each run starts
	block     chan struct{}
	release   func() // closes block, once
}

func newRecorder() *recorder {
	return &recorder{running: map[string]int{}, started: make(chan int, 1000)}
}

func newBlockedRecorder() *recorder {
	r := newRecorder()
	r.block = make(chan struct{})
	r.release = sync.OnceFunc(func() { close(r.block) })
	return r
}

func (r *recorder) run(batch []item) {
	r.mu.Lock()
	seen := map[string]bool{}
	for _, it := range batch {
		if !seen[it.key] && r.running[it.key] > 0 {
			r.conflicts = append(r.conflicts, it.key)
		}
		seen[it.key] = true
	}
	for k := range seen {
		r.running[k]++
	}
	r.batches = append(r.batches, slices.Clone(batch))
	r.maxSize = max(r.maxSize, len(batch))
	r.active++
	r.maxActive = max(r.maxActive, r.active)
	idx := len(r.batches) - 1
	r.mu.Unlock()
	r.started <- idx
	if r.block != nil {
		<-r.block
	}
	time.Sleep(time.Millisecond)
	r.mu.Lock()
	for k := range seen {
		r.running[k]--
	}
	r.active--
	r.mu.Unlock()
}

func start(cfg groupcommit.Config, r *recorder) (queue chan item, stop func() []item) {
	queue = make(chan item, cfg.MaxSize)
	halt := make(chan struct{})
	done := make(chan []item, 1)
	go func() { done <- groupcommit.Collect(cfg, queue, halt, keyOf, r.run) }()
	return queue, func() []item { close(halt); return <-done }
}

func waitStarted(t *testing.T, r *recorder) int {
	t.Helper()
	select {
	case i := <-r.started:
		return i
	case <-time.After(10 * time.Second):
		t.Fatal("no batch started within 10 s")
		return -1
	}
}

// TestCollectNeverRunsOneKeyInTwoBatches runs many concurrent writers with few keys. Every
// item runs exactly once, no batch exceeds MaxSize, and no two running batches share a key.
// The test first shows that the recorder's check catches a shared key.
func TestCollectNeverRunsOneKeyInTwoBatches(t *testing.T) {
	probe := newRecorder()
	probe.running["k"] = 1 // as if a batch with key k were running
	probe.run([]item{{key: "k"}})
	if len(probe.conflicts) != 1 {
		t.Fatalf("the recorder missed a key in two running batches: %v", probe.conflicts)
	}

	r := newRecorder()
	cfg := groupcommit.Config{MaxSize: 8, Linger: 200 * time.Microsecond, Workers: 3}
	queue, stop := start(cfg, r)
	const writers, each, keys = 16, 200, 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				queue <- item{key: fmt.Sprint((w + i) % keys), n: w*each + i}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		n := 0
		for _, b := range r.batches {
			n += len(b)
		}
		r.mu.Unlock()
		if n == writers*each || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if left := stop(); len(left) != 0 {
		t.Errorf("%d items left after every item ran", len(left))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ran := map[int]int{}
	for _, b := range r.batches {
		for _, it := range b {
			ran[it.n]++
		}
	}
	for n := range writers * each {
		if ran[n] != 1 {
			t.Fatalf("item %d ran %d times", n, ran[n])
		}
	}
	if len(r.conflicts) > 0 {
		t.Errorf("keys in two running batches at once: %v", r.conflicts)
	}
	if r.maxSize > cfg.MaxSize {
		t.Errorf("a batch of %d items, MaxSize %d", r.maxSize, cfg.MaxSize)
	}
	if r.maxActive > cfg.Workers {
		t.Errorf("%d batches at once, Workers %d", r.maxActive, cfg.Workers)
	}
}

// TestCollectWaitsForTheRunningBatch checks that a batch that is not full waits up to
// another Linger for the running one, instead of taking the idle worker. The two run one
// after the other.
func TestCollectWaitsForTheRunningBatch(t *testing.T) {
	r := newBlockedRecorder()
	cfg := groupcommit.Config{MaxSize: 100, Linger: time.Second, Workers: 2}
	queue, stop := start(cfg, r)
	defer func() { r.release(); stop() }()
	queue <- item{key: "a"}
	waitStarted(t, r) // after one Linger
	queue <- item{key: "b"}
	time.Sleep(cfg.Linger + 200*time.Millisecond) // b has lingered; a still runs
	select {
	case <-r.started:
		t.Fatal("the second batch took the idle worker while the first was running, before 2×Linger")
	default:
	}
	r.release() // a finishes: b runs now, well before its 2×Linger
	waitStarted(t, r)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.maxActive != 1 {
		t.Errorf("%d batches ran at once, want 1", r.maxActive)
	}
}

// TestCollectUsesIdleWorkersForLateOrFullBatches checks that the next batch takes the idle
// worker when the first batch still runs after 2×Linger. A full batch takes it at once.
func TestCollectUsesIdleWorkersForLateOrFullBatches(t *testing.T) {
	r := newBlockedRecorder()
	cfg := groupcommit.Config{MaxSize: 4, Linger: 50 * time.Millisecond, Workers: 3}
	queue, stop := start(cfg, r)
	defer func() { r.release(); stop() }()
	queue <- item{key: "a"}
	waitStarted(t, r)
	queue <- item{key: "b"}
	waitStarted(t, r) // after 2×Linger, a still running
	for i := range 4 {
		queue <- item{key: fmt.Sprint("c", i)}
	}
	waitStarted(t, r) // full: at once
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.maxActive != 3 || len(r.batches) != 3 || len(r.batches[2]) != 4 {
		t.Errorf("batches %v, %d at once; want [a] [b] [c0..c3] all running", r.batches, r.maxActive)
	}
}

// TestCollectHoldsRunningKeysAndReturnsWhatItDidNotRun checks that items of a key in a
// running batch are held for a later batch. On stop, items taken but not run come back.
// Closing the queue stops Collect the same way.
func TestCollectHoldsRunningKeysAndReturnsWhatItDidNotRun(t *testing.T) {
	r := newBlockedRecorder()
	cfg := groupcommit.Config{MaxSize: 10, Linger: time.Millisecond, Workers: 2}
	queue, stop := start(cfg, r)
	defer r.release()
	queue <- item{key: "a", n: 1}
	waitStarted(t, r)
	queue <- item{key: "a", n: 2} // held: a is running
	queue <- item{key: "b", n: 3}
	waitStarted(t, r) // b's batch, after 2×Linger, without a
	r.mu.Lock()
	second := slices.Clone(r.batches[1])
	r.mu.Unlock()
	if len(second) != 1 || second[0].n != 3 {
		t.Errorf("second batch %v, want only item 3 (item 2's key is running)", second)
	}
	queue <- item{key: "c", n: 4} // no idle worker
	time.Sleep(20 * time.Millisecond)
	r.release()
	waitStarted(t, r) // c, with or without item 2 (depending on which batch finished first)
	time.Sleep(20 * time.Millisecond)
	left := stop()
	r.mu.Lock()
	var got []item
	for _, b := range r.batches[2:] {
		got = append(got, b...)
	}
	r.mu.Unlock()
	got = append(got, left...)
	slices.SortFunc(got, func(x, y item) int { return x.n - y.n })
	if len(got) != 2 || got[0].n != 2 || got[1].n != 4 {
		t.Errorf("later batches and left over: %v, want items 2 and 4, each once", got)
	}

	r2 := newRecorder()
	q2 := make(chan item, 1)
	done := make(chan []item, 1)
	go func() { done <- groupcommit.Collect(cfg, q2, nil, keyOf, r2.run) }()
	q2 <- item{key: "x"}
	close(q2)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Collect did not return after its queue was closed")
	}
}

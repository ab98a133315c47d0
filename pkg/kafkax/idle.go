package kafkax

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// An idle subscription stops fetching. Sarama's broker consumer sends a fetch for its
// partitions every kafka.max_poll_wait, even when they are empty, and its configuration
// cannot change while it runs. So once no claim of a subscription has read or held a
// record for ParallelConfig.IdleAfter, the idler pauses every claim, and Sarama sends no
// fetch for them. The idler watches the paused partitions with a fetch of its own, one per
// broker, which waits at the broker up to ParallelConfig.IdlePoll and is answered at the
// first record. A record, or any doubt, resumes every claim: an error, a claim that read a
// record, a leader that cannot be asked. Sarama then fetches within its 100 ms batching.
//
// A claim is paused only where nothing is left to read. Its marked offset is its next
// record, since nothing is in flight. The partition's last stable offset must equal it,
// or the span between them must hold only transaction markers and aborted records. That
// span is read as LagReader reads lag. The watch fetches from that last stable offset.

// idleState is a claim's part of the idler's work, under claimRun.idleMu.
type idleState struct {
	paused   bool
	stable   int64 // the partition's last stable offset when it was paused
	lastMark int64 // the marked offset at the idler's last look
	stopped  bool  // the claim stopped reading: stopReading paused it for good
}

// idler runs beside one subscription until ctx ends or the subscriber closes.
type idler struct {
	s     *ParallelSubscriber
	f     *feed
	after time.Duration
	poll  time.Duration

	mu     sync.Mutex
	client sarama.Client // made at the first pause, for the offset requests and the watch
	lag    *LagReader    // on client
	closed bool

	quietSince time.Time
}

// idleLook bounds how often the idler looks at the claims while they run.
func idleLook(after time.Duration) time.Duration {
	return min(max(after/4, 10*time.Millisecond), 250*time.Millisecond)
}

func (s *ParallelSubscriber) runIdler(ctx context.Context, f *feed) {
	if s.pc.IdleAfter <= 0 {
		return
	}
	d := &idler{s: s, f: f, after: s.pc.IdleAfter, poll: s.pc.IdlePoll, quietSince: time.Now()}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// A watch waiting at the broker ends when its client closes.
		select {
		case <-ctx.Done():
		case <-s.closing:
		case <-stop:
		}
		d.close()
	}()
	t := time.NewTicker(idleLook(d.after))
	defer t.Stop()
	for {
		if d.watching() {
			d.watch()
		} else {
			select {
			case <-t.C:
			case <-ctx.Done():
			case <-s.closing:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		default:
		}
		d.look(time.Now())
	}
}

func (d *idler) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.client != nil {
		_ = d.client.Close()
	}
}

// claims returns the claims of the idler's subscription.
func (d *idler) claims() []*claimRun {
	d.s.claimsMu.Lock()
	defer d.s.claimsMu.Unlock()
	var out []*claimRun
	for r := range d.s.claims {
		if r.h.feed == d.f {
			out = append(out, r)
		}
	}
	return out
}

// paused returns the claims the idler holds paused, and the offsets to watch them from.
func (d *idler) paused() ([]*claimRun, map[int32]int64) {
	var out []*claimRun
	from := map[int32]int64{}
	for _, r := range d.claims() {
		r.idleMu.Lock()
		if r.idle.paused && !r.idle.stopped {
			out = append(out, r)
			from[r.partition] = r.idle.stable
		}
		r.idleMu.Unlock()
	}
	return out, from
}

func (d *idler) watching() bool {
	ps, _ := d.paused()
	return len(ps) > 0
}

// look resumes every claim once one is active, and pauses the quiet ones after IdleAfter.
func (d *idler) look(now time.Time) {
	claims := d.claims()
	active := false
	for _, r := range claims {
		if r.active() {
			active = true
		}
	}
	if active || len(claims) == 0 {
		d.quietSince = now
		d.resume(claims)
		return
	}
	if now.Sub(d.quietSince) < d.after {
		return
	}
	var quiet []*claimRun
	for _, r := range claims {
		r.idleMu.Lock()
		if !r.idle.stopped && !r.idle.paused {
			quiet = append(quiet, r)
		}
		r.idleMu.Unlock()
	}
	if len(quiet) > 0 {
		d.pause(quiet)
	}
}

// watch fetches the paused partitions from their last stable offsets, one fetch per
// leader, each waiting up to IdlePoll. It resumes every claim at the first record, error
// or leader it cannot reach, and returns once every fetch has returned.
func (d *idler) watch() {
	claims, from := d.paused()
	client, err := d.ensureClient()
	if err != nil {
		d.wake(err)
		return
	}
	reqs := map[*sarama.Broker]*sarama.FetchRequest{}
	for _, r := range claims {
		b, err := client.Leader(d.f.topic, r.partition)
		if err != nil {
			_ = client.RefreshMetadata(d.f.topic)
			d.wake(fmt.Errorf("leader of %s/%d: %w", d.f.topic, r.partition, err))
			return
		}
		req := reqs[b]
		if req == nil {
			req = &sarama.FetchRequest{Version: 11, MaxWaitTime: int32(d.poll / time.Millisecond), MinBytes: 1,
				MaxBytes: lagFetchBytes, Isolation: sarama.ReadCommitted, SessionID: 0, SessionEpoch: -1}
			reqs[b] = req
		}
		req.AddBlock(d.f.topic, r.partition, from[r.partition], lagFetchBytes, -1)
	}
	results := make(chan error, len(reqs))
	for b, req := range reqs {
		go func() {
			resp, err := b.Fetch(req)
			if err != nil {
				_ = client.RefreshMetadata(d.f.topic)
				results <- err
				return
			}
			results <- grew(resp, d.f.topic, from)
		}()
	}
	woke := false
	for range reqs {
		if err := <-results; err != nil && !woke {
			woke = true
			d.wake(err)
		}
	}
}

// errGrew says that a paused partition holds a record past its last stable offset.
var errGrew = errors.New("a paused partition grew")

// grew returns errGrew if the watch found a record, or the error of a partition.
func grew(resp *sarama.FetchResponse, topic string, from map[int32]int64) error {
	for p, off := range from {
		b := resp.GetBlock(topic, p)
		if b == nil {
			continue // a partition of another leader
		}
		if !errors.Is(b.Err, sarama.ErrNoError) {
			return fmt.Errorf("watch of %s/%d: %w", topic, p, b.Err)
		}
		if b.LastStableOffset > off || len(b.RecordsSet) > 0 {
			return errGrew
		}
	}
	return nil
}

// wake resumes every claim of the subscription.
func (d *idler) wake(err error) {
	if !errors.Is(err, errGrew) && !d.isClosed() {
		d.s.logger.Debug("Idle consumer resumes: partitions not watched", watermill.LogFields{"topic": d.f.topic, "err": err.Error()})
	}
	d.quietSince = time.Now()
	d.resume(d.claims())
}

func (d *idler) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

func (d *idler) ensureClient() (sarama.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, sarama.ErrClosedClient
	}
	if d.client == nil {
		sc := *d.s.sarama
		sc.Consumer.Interceptors = nil
		sc.Net.ReadTimeout = d.poll + 5*time.Second
		c, err := sarama.NewClient(d.s.brokers, &sc)
		if err != nil {
			return nil, err
		}
		d.client, d.lag = c, &LagReader{client: c, proven: map[topicPartition]lagSpan{}}
	}
	return d.client, nil
}

// pause pauses the claims whose partitions hold nothing more to read.
func (d *idler) pause(claims []*claimRun) {
	stable, err := d.offsets(claims, sarama.OffsetNewest)
	if err != nil {
		d.s.logger.Debug("Idle consumer stays: offsets not read", watermill.LogFields{"topic": d.f.topic, "err": err.Error()})
		return
	}
	var unknown []*claimRun
	for _, r := range claims {
		if r.markedOffset() < 0 {
			unknown = append(unknown, r)
		}
	}
	starts := map[int32]int64{}
	if len(unknown) > 0 {
		if starts, err = d.offsets(unknown, sarama.OffsetOldest); err != nil {
			return
		}
	}
	for _, r := range claims {
		from := r.markedOffset()
		if from < 0 {
			from = starts[r.partition]
		}
		end, ok := stable[r.partition]
		if !ok || from > end {
			continue
		}
		if from < end {
			if lag, err := d.lag.Lag(d.f.topic, r.partition, from, end); err != nil || lag > 0 {
				continue
			}
		}
		r.pauseIdle(end)
	}
}

func (d *idler) resume(claims []*claimRun) {
	for _, r := range claims {
		r.resumeIdle()
	}
}

// offsets asks each partition's leader for the partition's offset at time at, the newest
// (its last stable offset, as a read_committed consumer sees it) or the oldest. It sends one
// request per broker.
func (d *idler) offsets(claims []*claimRun, at int64) (map[int32]int64, error) {
	client, err := d.ensureClient()
	if err != nil {
		return nil, err
	}
	reqs := map[*sarama.Broker]*sarama.OffsetRequest{}
	for _, r := range claims {
		b, err := client.Leader(d.f.topic, r.partition)
		if err != nil {
			_ = client.RefreshMetadata(d.f.topic)
			return nil, fmt.Errorf("leader of %s/%d: %w", d.f.topic, r.partition, err)
		}
		req := reqs[b]
		if req == nil {
			req = &sarama.OffsetRequest{Version: 2, IsolationLevel: sarama.ReadCommitted}
			reqs[b] = req
		}
		req.AddBlock(d.f.topic, r.partition, at, 1)
	}
	out := make(map[int32]int64, len(claims))
	for b, req := range reqs {
		resp, err := b.GetAvailableOffsets(req)
		if err != nil {
			_ = client.RefreshMetadata(d.f.topic)
			return nil, err
		}
		for _, r := range claims {
			blk := resp.GetBlock(d.f.topic, r.partition)
			if blk == nil {
				continue
			}
			if !errors.Is(blk.Err, sarama.ErrNoError) {
				_ = client.RefreshMetadata(d.f.topic)
				return nil, fmt.Errorf("offsets of %s/%d: %w", d.f.topic, r.partition, blk.Err)
			}
			out[r.partition] = blk.Offset
		}
	}
	return out, nil
}

// active reports whether the claim read or held a record since the idler's last look.
func (r *claimRun) active() bool {
	n, _ := r.ahead.held()
	busy := n > 0 || r.admitting.Load() != 0
	r.mu.Lock()
	mark := r.marked
	busy = busy || len(r.queue) > 0 || r.unsettled > 0 || len(r.waiting) > 0
	r.mu.Unlock()
	r.idleMu.Lock()
	defer r.idleMu.Unlock()
	moved := mark != r.idle.lastMark
	r.idle.lastMark = mark
	return busy || moved
}

func (r *claimRun) markedOffset() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.marked
}

// pauseIdle pauses the claim's partition, which holds nothing to read below stable.
func (r *claimRun) pauseIdle(stable int64) {
	p, ok := r.claim.(interface{ Pause() })
	if !ok {
		return
	}
	r.idleMu.Lock()
	defer r.idleMu.Unlock()
	if r.idle.stopped || r.idle.paused {
		return
	}
	r.idle.paused, r.idle.stable = true, stable
	p.Pause()
	r.h.s.idlePauses.Add(1)
}

// resumeIdle resumes the claim's partition if the idler paused it.
func (r *claimRun) resumeIdle() {
	p, ok := r.claim.(interface{ Resume() })
	if !ok {
		return
	}
	r.idleMu.Lock()
	defer r.idleMu.Unlock()
	if r.idle.stopped || !r.idle.paused {
		return
	}
	r.idle.paused = false
	p.Resume()
}

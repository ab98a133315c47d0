package kafkax

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// Acked above the committed offset. A partition's committed offset stops at its oldest
// un-acked message, so with a window of messages in flight a rebalance or a restart would
// hand out again every message acked past it: up to kafka.window per partition, each a
// copy the inbox turns away. The parallel subscriber therefore commits, with each offset,
// which messages past it were acked, in the offset commit's metadata (as Confluent's
// parallel consumer does). The next claim of the partition, in this process or another,
// reads that metadata and does not hand those messages out again; they count as acked at
// once, so the committed offset still reaches the end of the partition.
//
// The metadata names the offset it was written with, and a claim uses it only when that is
// the offset it starts from, so an offset reset by an operator or another writer of the
// group's offsets (whose metadata is anything else) leaves every message to be read again.
// Only messages acked are listed, the condition under which the offset itself moves past a
// message, so a listed message is one an ack said was done. What does not fit in
// ackedMetadataMax is left out and read again, as before.

// ackedPrefix starts the metadata this package writes: its format's version, then the
// offset it was written with, then the acked runs.
const ackedPrefix = "onceflow-acked1:"

// ackedMetadataMax is the most bytes of metadata written with an offset. Kafka refuses an
// offset commit whose metadata is over offset.metadata.max.bytes (4,096 by default), and
// then commits none of the request's offsets.
const ackedMetadataMax = 2048

// ackedEvery is how soon after an ack leaves acked messages past the marked offset their
// metadata is marked for commit. Sarama commits marked offsets every second.
const ackedEvery = 500 * time.Millisecond

// ackedRange is the offsets first..last, every message of which was acked. Offsets in it
// that no message was delivered for (transaction markers, compacted records) are harmless:
// no message is read for them.
type ackedRange struct{ first, last int64 }

// encodeAcked writes the metadata of offset with runs, in offset order and past offset. A
// run is written as the distance from the end of the one before it and its length, as
// uvarints, in unpadded URL-safe base64. Runs that would take it past ackedMetadataMax
// are left out, from the last.
func encodeAcked(offset int64, runs []ackedRange) string {
	if len(runs) == 0 {
		return ""
	}
	head := ackedPrefix + strconv.FormatInt(offset, 10) + ":"
	room := base64.RawURLEncoding.DecodedLen(ackedMetadataMax - len(head))
	buf := make([]byte, 0, min(room, 2*binary.MaxVarintLen64*len(runs)))
	next := offset
	for _, r := range runs {
		var tmp [2 * binary.MaxVarintLen64]byte
		n := binary.PutUvarint(tmp[:], uint64(r.first-next))
		n += binary.PutUvarint(tmp[n:], uint64(r.last-r.first+1))
		if len(buf)+n > room {
			break
		}
		buf = append(buf, tmp[:n]...)
		next = r.last + 1
	}
	if len(buf) == 0 {
		return ""
	}
	return head + base64.RawURLEncoding.EncodeToString(buf)
}

// decodeAcked reads metadata that encodeAcked wrote with offset. It returns nil for any
// other metadata, and for metadata written with another offset.
func decodeAcked(md string, offset int64) []ackedRange {
	rest, ok := strings.CutPrefix(md, ackedPrefix)
	if !ok {
		return nil
	}
	at, enc, ok := strings.Cut(rest, ":")
	if !ok || at != strconv.FormatInt(offset, 10) {
		return nil
	}
	buf, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return nil
	}
	var runs []ackedRange
	next := offset
	for len(buf) > 0 {
		gap, n := binary.Uvarint(buf)
		if n <= 0 {
			return nil
		}
		buf = buf[n:]
		length, n := binary.Uvarint(buf)
		if n <= 0 || length == 0 || gap > 1<<62 || length > 1<<62 {
			return nil
		}
		buf = buf[n:]
		first := next + int64(gap)
		last := first + int64(length) - 1
		if first < next || last < first {
			return nil
		}
		runs = append(runs, ackedRange{first, last})
		next = last + 1
	}
	return runs
}

// ackedRunsLocked returns the runs of acked messages in the queue, past the marked offset.
// Consecutive acked messages of the queue make one run from the first one's offset to the
// last one's: no message was delivered between them. The caller holds r.mu.
func (r *claimRun) ackedRunsLocked() []ackedRange {
	var runs []ackedRange
	open := false
	for _, sl := range r.queue {
		switch {
		case !sl.acked:
			open = false
		case open:
			runs[len(runs)-1].last = sl.offset
		default:
			runs = append(runs, ackedRange{sl.offset, sl.offset})
			open = true
		}
	}
	return runs
}

// noteAckedLocked makes sure the acked messages past the marked offset are written with
// it within ackedEvery. The caller holds r.mu.
func (r *claimRun) noteAckedLocked() {
	if r.ackedTimer != nil || r.ackedDone || r.h.s.ackedOff() {
		return
	}
	r.ackedTimer = time.AfterFunc(ackedEvery, r.markAcked)
}

// markAcked marks the offset marked for commit again, with the metadata of the acked
// messages past it.
func (r *claimRun) markAcked() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ackedTimer = nil
	if !r.ackedDone {
		r.markAckedLocked()
	}
}

// markAckedLocked is markAcked for a caller holding r.mu. Sarama's ResetOffset, at the
// offset marked already, replaces only the metadata.
func (r *claimRun) markAckedLocked() {
	if r.marked < 0 {
		return
	}
	md := ""
	if !r.h.s.ackedOff() {
		md = encodeAcked(r.marked, r.ackedRunsLocked())
	}
	if md == r.ackedMD {
		return
	}
	r.ackedMD = md
	r.sess.ResetOffset(r.topic, r.partition, r.marked, md)
}

// stopAcked marks the acked messages past the marked offset one last time, as the claim
// ends, so that the commit as the partition is given up carries them.
func (r *claimRun) stopAcked() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ackedTimer != nil {
		r.ackedTimer.Stop()
		r.ackedTimer = nil
	}
	r.markAckedLocked()
	r.ackedDone = true
}

// ackedFetchWait is the longest a claim waits, as it starts, for the metadata committed
// with its offset, before it reads every message again instead.
const ackedFetchWait = 2 * time.Second

// committedAcked reads the metadata committed with the partition's offset and returns the
// acked runs it lists past initial, the offset the claim starts from. An error, or no
// answer within ackedFetchWait, leaves every message to be read again.
func (h *parallelHandler) committedAcked(topic string, partition int32, initial int64, logFields watermill.LogFields) []ackedRange {
	if h.coord == nil || initial < 0 || h.s.ackedOff() {
		return nil
	}
	type answer struct {
		md  string
		err error
	}
	done := make(chan answer, 1)
	go func() {
		md, err := h.committedMetadata(topic, partition, initial)
		done <- answer{md, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-time.After(ackedFetchWait):
		a.err = fmt.Errorf("no answer in %s", ackedFetchWait)
	}
	if a.err != nil {
		h.s.logger.Info("Cannot read the messages acked past the committed offset; they are read again", logFields.Add(watermill.LogFields{"err": a.err.Error()}))
		return nil
	}
	return decodeAcked(a.md, initial)
}

// committedMetadata asks the group's coordinator for the metadata committed with the
// partition's offset. It is "" when the committed offset is not initial.
func (h *parallelHandler) committedMetadata(topic string, partition int32, initial int64) (string, error) {
	b, err := h.coord.Coordinator(h.s.group)
	if err != nil {
		return "", err
	}
	req := sarama.NewOffsetFetchRequest(h.coord.Config().Version, h.s.group, map[string][]int32{topic: {partition}})
	resp, err := b.FetchOffset(req)
	if err != nil {
		return "", err
	}
	blk := resp.GetBlock(topic, partition)
	if blk == nil {
		return "", nil
	}
	if blk.Err != sarama.ErrNoError {
		return "", blk.Err
	}
	if blk.Offset != initial {
		return "", nil
	}
	return blk.Metadata, nil
}

// skipAcked reports whether the message at offset was acked by an earlier claim, by the
// runs the claim started with, and drops the runs it has passed.
func (r *claimRun) skipAcked(offset int64) bool {
	for len(r.skip) > 0 && r.skip[0].last < offset {
		r.skip = r.skip[1:]
	}
	return len(r.skip) > 0 && r.skip[0].first <= offset
}

// admitAcked puts sl, acked by an earlier claim, in the window as acked, and marks the
// offset past the acked prefix of the queue. ok is false when the session ends first.
func (r *claimRun) admitAcked(sl *slot) bool {
	for {
		r.mu.Lock()
		if len(r.queue) < r.window {
			if r.marked < 0 {
				r.marked = sl.offset
			}
			sl.acked, sl.settled = true, true
			r.queue = append(r.queue, sl)
			r.advanceLocked()
			if len(r.queue) > 0 && sl.offset > r.queue[0].offset {
				r.noteAckedLocked() // still past an un-acked message, so it is written again
			}
			r.mu.Unlock()
			r.h.s.skippedAcked.Add(1)
			return true
		}
		r.mu.Unlock()
		select {
		case <-r.changed:
		case <-r.stop:
			return false
		}
	}
}

// SkippedAcked is how many messages the subscriber did not hand out again because an
// earlier claim of their partition acked them past its committed offset.
func (s *ParallelSubscriber) SkippedAcked() int64 { return s.skippedAcked.Load() }

// ackedOff reports whether the subscriber writes and reads no acked messages past its
// committed offsets: a test turned them off, or the broker refused their metadata.
func (s *ParallelSubscriber) ackedOff() bool { return s.noAckedMetadata || s.ackedRefused.Load() }

// refuseAcked stops writing the acked messages past the committed offsets, once the broker
// refused an offset commit for its metadata (ErrOffsetMetadataTooLarge: its
// offset.metadata.max.bytes is under ackedMetadataMax). Sarama keeps the refused offset
// marked, so every claim marks its offset again at once without metadata, and later
// commits carry none: the offsets move on, and a rebalance or a restart redelivers the
// messages acked past them, as with no metadata at all.
func (s *ParallelSubscriber) refuseAcked(logFields watermill.LogFields) {
	if s.ackedRefused.Swap(true) {
		return
	}
	s.logger.Error("The broker refuses the acked messages past the committed offsets in the commit's metadata; "+
		"offsets are committed without them from now on, so a rebalance or a restart redelivers those messages. "+
		"Raise the brokers' offset.metadata.max.bytes to at least 2048 to keep them", sarama.ErrOffsetMetadataTooLarge, logFields)
	s.claimsMu.Lock()
	runs := make([]*claimRun, 0, len(s.claims))
	for r := range s.claims {
		runs = append(runs, r)
	}
	s.claimsMu.Unlock()
	for _, r := range runs {
		r.mu.Lock()
		r.markAckedLocked()
		r.mu.Unlock()
	}
}

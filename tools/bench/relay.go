package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/onceflow/onceflow/outbox"
)

// relayGroup measures the outbox relays, then Watermill's forwarder next to their lines.
func (s *suite) relayGroup(ctx context.Context) error {
	if err := s.benchRelay(ctx); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if err := s.benchForwarder(ctx); err != nil {
		return fmt.Errorf("watermill_forwarder: %w", err)
	}
	return nil
}

// benchRelay: outbox rows already committed → relay to a fresh topic.
func (s *suite) benchRelay(ctx context.Context) error {
	db, kc := s.db, s.kc
	if err := s.truncate(ctx); err != nil {
		return err
	}
	topic, cleanup, err := makeTopic(kc, "bench-relay", 12)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := fillOutbox(ctx, db, topic, s.cfg.relayN); err != nil {
		return err
	}
	producer, err := kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	alo, err := outbox.NewRelay(db, producer, outbox.RelayConfig{BatchSize: s.cfg.relayBatch}, nil)
	if err != nil {
		return err
	}
	if err := s.drainRelay(ctx, alo, "at_least_once", 0); err != nil {
		return err
	}
	// The same rows again, through the exactly-once relay (transactional producer, positions
	// in the same Kafka transaction, lease).
	if _, err := db.ExecContext(ctx, "UPDATE outbox SET published_at = NULL"); err != nil {
		return err
	}
	positions, dropPositions := positionsTopic(kc)
	defer dropPositions()
	eos, err := outbox.NewExactlyOnceRelay(db, kc, outbox.RelayConfig{BatchSize: s.cfg.relayBatch, PositionsTopic: positions,
		TransactionalID: fmt.Sprintf("bench-%d", time.Now().UnixNano())}, nil)
	if err != nil {
		return err
	}
	defer eos.Close()
	if err := s.drainRelay(ctx, eos, "exactly_once", 1); err != nil || s.cfg.relayShards < 2 {
		return err
	}
	// Once more with the outbox split into shards, published at once by one relay (one
	// transactional producer per shard).
	if _, err := db.ExecContext(ctx, "UPDATE outbox SET published_at = NULL"); err != nil {
		return err
	}
	shardPositions, dropShardPositions := positionsTopic(kc)
	defer dropShardPositions()
	sharded, err := outbox.NewExactlyOnceRelay(db, kc, outbox.RelayConfig{BatchSize: s.cfg.relayBatch, Shards: s.cfg.relayShards, Shard: "bench",
		PositionsTopic: shardPositions, TransactionalID: fmt.Sprintf("bench-sharded-%d", time.Now().UnixNano())}, nil)
	if err != nil {
		return err
	}
	defer sharded.Close()
	return s.drainRelay(ctx, sharded, fmt.Sprintf("exactly_once_%d_shards", s.cfg.relayShards), s.cfg.relayShards)
}

// drainRelay runs the relay as the router does (Run: in exactly-once mode a batch's database
// mark overlaps the next batch's read and Kafka transaction) until it has published and
// marked every row. The rate and the CPU per event of each process (the relay runs in the
// bench's) are measured from the end of the relay's start (lease, session, reconciliation;
// reported as start_ms), which happens once per process.
func (s *suite) drainRelay(ctx context.Context, relay *outbox.Relay, mode string, sessions int) error {
	n := s.cfg.relayN
	// The purge of the rows just written or reset is not this run's work.
	if err := s.waitPurge(ctx); err != nil {
		return err
	}
	begin := time.Now()
	start := begin
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	deadline := time.After(5 * time.Minute)
	started := sessions == 0
	cpu := newCPUMeter(s.services)
	for relay.Published() < int64(n) {
		if !started && relay.Sessions() >= int64(sessions) {
			started, start = true, time.Now()
			cpu = newCPUMeter(s.services)
		}
		select {
		case err := <-done:
			cancel()
			return fmt.Errorf("%s: relay stopped after %d events: %v", mode, relay.Published(), err)
		case <-deadline:
			// Stuck: show where every goroutine is before stopping it.
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			cancel()
			<-done
			return fmt.Errorf("%s: %d of %d events after 5 minutes (failures %d)", mode, relay.Published(), n, relay.Failures())
		case <-time.After(2 * time.Millisecond):
		}
	}
	el := time.Since(start)
	kv := cpu.perEvent(n)
	cancel()
	<-done
	s.report("relay", append([]any{"events_per_s", float64(relay.Published()) / el.Seconds(), "events", relay.Published(), "mode", mode, "batches", relay.Batches(),
		"start_ms", start.Sub(begin).Milliseconds()}, kv...)...)
	return nil
}

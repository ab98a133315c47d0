package outbox_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// outageDuration is OFTEST_OUTAGE, 30s by default.
func outageDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("OFTEST_OUTAGE")
	if v == "" {
		return 30 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("OFTEST_OUTAGE: %v", err)
	}
	return d
}

// dualWriter is the naive design the outbox replaces. Each business transaction sends its
// event to Kafka itself and commits only if Kafka took it. It counts the attempts that
// committed and those that failed, per phase. Phase 0 is before the outage, 1 during it and
// 2 after it. An attempt belongs to the phase in which it started.
type dualWriter struct {
	phase    atomic.Int32
	commits  [3]atomic.Int64
	failures [3]atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startDualWriter(t *testing.T, k kafkax.Config, topic string) *dualWriter {
	t.Helper()
	sc := k.ProducerConfig()
	sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
	sc.Producer.Retry.Max, sc.Producer.Retry.Backoff = 1, 100*time.Millisecond
	sc.Metadata.Retry.Max, sc.Metadata.Retry.Backoff = 1, 100*time.Millisecond
	p, err := sarama.NewSyncProducer(k.Brokers, sc)
	if err != nil {
		t.Fatalf("dual-write producer: %v", err)
	}
	dw := &dualWriter{stop: make(chan struct{})}
	dw.wg.Go(func() {
		defer p.Close()
		for i := 0; ; i++ {
			select {
			case <-dw.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ph := dw.phase.Load()
			_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("dual"), Value: sarama.StringEncoder(fmt.Sprint(i))})
			if err != nil {
				dw.failures[ph].Add(1)
			} else {
				dw.commits[ph].Add(1)
			}
		}
	})
	t.Cleanup(dw.finish)
	return dw
}

func (dw *dualWriter) finish() {
	select {
	case <-dw.stop:
	default:
		close(dw.stop)
	}
	dw.wg.Wait()
}

// TestEOSRelayRealBrokerStopped stops a real broker for OFTEST_OUTAGE, 30s by default,
// while orders keep arriving. The broker is a private one, a child process of this test, so
// the shared broker keeps serving other tests. Business transactions that only write to the
// outbox keep committing. Every writer commits during the outage, and none fails. A
// dual-write transaction sends to Kafka and then commits, and it commits nothing. That is
// what the outbox is for, and it shows the broker was really gone. The broker then starts
// again with the same port and data. The exactly-once relay drains the outbox, and a
// read_committed consumer sees every event exactly once, in per-key order.
func TestEOSRelayRealBrokerStopped(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	if runWithoutRace(t) { // Sarama's error paths race (IBM/sarama#2913)
		return
	}
	outage := outageDuration(t)
	const writers = 4
	d := testenv.DB(t, writers+8)
	pk := testenv.StartPrivateKafka(t)
	k := pk.Config()
	topic := testenv.Topic(t, k, "outbox-broker-stop", 4)
	dualTopic := testenv.Topic(t, k, "dual-write", 1)
	cfg := eosConfig(t, k, outbox.RelayConfig{BatchSize: 100, PollInterval: 5 * time.Millisecond, Linger: 5 * time.Millisecond,
		RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: time.Second, TxnTimeout: 10 * time.Second,
		Tune: func(sc *sarama.Config) {
			sc.Net.DialTimeout = 2 * time.Second
			sc.Net.ReadTimeout, sc.Net.WriteTimeout = 5*time.Second, 5*time.Second
		}})
	relay := newEOSRelay(t, d.DB, k, cfg)
	stop := runRelay(t, relay)
	pw := startPacedWriters(t, d.DB, topic, writers, 5*time.Millisecond)
	dw := startDualWriter(t, k, dualTopic)

	waitFor(t, 60*time.Second, "the relay to publish before the outage", func() bool { return relay.Published() > 0 })
	t.Logf("stopping the broker (pid in %s) for %s; relay published %d so far", pk.Dir(), outage, relay.Published())
	pk.Stop()
	dw.phase.Store(1)
	failuresAtStop, from := relay.Failures(), len(pw.committed())
	time.Sleep(outage)
	during := pw.committed()[from:]
	pending := pendingRows(t, d.DB)
	dw.phase.Store(2)
	t.Logf("broker down %s: %d events committed by outbox transactions, %d rows pending, %d failed relay attempts; dual-write: %d committed, %d failed",
		outage, len(during), pending, relay.Failures()-failuresAtStop, dw.commits[1].Load(), dw.failures[1].Load())
	if errs := pw.failed(); len(errs) > 0 {
		t.Fatalf("business transactions failed while the broker was down: %v", errs)
	}
	perWriter := map[string]int{}
	for _, id := range during {
		w, _, _ := strings.Cut(id, "-")
		perWriter[w]++
	}
	if len(perWriter) != writers || pending == 0 {
		t.Fatalf("while the broker was down %d of %d writers committed (%v), %d rows pending: a writer was blocked, or nothing was exercised",
			len(perWriter), writers, perWriter, pending)
	}
	if dw.commits[1].Load() != 0 || dw.failures[1].Load() == 0 {
		t.Fatalf("dual-write while the broker was down: %d committed, %d failed; want 0 committed (the broker was not really gone?)",
			dw.commits[1].Load(), dw.failures[1].Load())
	}

	pk.Start()
	restarted := time.Now()
	time.Sleep(time.Second) // orders keep arriving after the broker is back
	ids := pw.finish(t)
	dw.finish()
	waitAllPublished(t, d.DB, len(ids), 3*time.Minute)
	t.Logf("%d events drained %s after the broker was back", len(ids), time.Since(restarted).Round(time.Millisecond))
	stop()
	if relay.Failures() == failuresAtStop {
		t.Error("the relay reported no failed attempt while the broker was down")
	}
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	assertPerKeyOrder(t, d.DB, recs)
}

// waitFor polls cond every 50ms for at most bound. The bound guards against hanging and is
// not a timing assertion.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

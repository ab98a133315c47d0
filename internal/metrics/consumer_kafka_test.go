package metrics_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// txnProduce writes values in one Kafka transaction, committed or aborted. It uses the
// relay's producer settings, idempotent with all acks and a transactional id.
func txnProduce(t *testing.T, p sarama.SyncProducer, topic string, commit bool, values ...string) {
	t.Helper()
	if err := p.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(v)}); err != nil {
			t.Fatal(err)
		}
	}
	end := p.CommitTxn
	if !commit {
		end = p.AbortTxn
	}
	if err := end(); err != nil {
		t.Fatal(err)
	}
}

// lagSeries returns the lag series line of the metric, or "" when absent.
func lagSeries(t *testing.T, m *metrics.Metrics) string {
	for _, l := range strings.Split(series(t, m), "\n") {
		if strings.HasPrefix(l, "onceflow_consumer_lag_messages{") {
			return l
		}
	}
	return ""
}

// TestConsumerLagIgnoresTransactionMarkers consumes a topic written in a committed Kafka
// transaction and then an aborted one, and acks everything. The offsets past the committed
// one hold a commit marker, aborted records and an abort marker. So the offsets' difference
// stays at 4 for good, while the lag the metric reports drops to 0. A new committed record
// not acked yet counts again.
func TestConsumerLagIgnoresTransactionMarkers(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "lag-txn", 1)
	sc := kc.ProducerConfig()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	sc.Producer.Transaction.ID = "onceflow-test-lag-" + hex.EncodeToString(b)
	sc.Producer.Flush.MaxMessages = 0
	p, err := sarama.NewSyncProducer(kc.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	txnProduce(t, p, topic, true, "a", "b", "c") // offsets 0-2, commit marker 3
	txnProduce(t, p, topic, false, "x", "y")     // aborted 4-5, abort marker 6

	m := metrics.New(nil)
	lr, err := kc.NewLagReader()
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	m.Consumers.JudgeLag(lr)
	sub, err := kc.NewParallelSubscriber("lag-txn-"+hex.EncodeToString(b), kafkax.ParallelConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	m.Consumers.Add(sub)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	ackNext := func(want string) {
		t.Helper()
		select {
		case msg := <-ch:
			if string(msg.Payload) != want {
				t.Fatalf("received %q, want %q", msg.Payload, want)
			}
			msg.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("no message %q", want)
		}
	}
	for _, v := range []string{"a", "b", "c"} {
		ackNext(v)
	}
	waitFor := func(what string, ok func(raw int64, series string) bool) {
		t.Helper()
		var raw int64
		var s string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			raw = -1
			if st := sub.PartitionStats(); len(st) == 1 {
				if n, known := st[0].Lag(); known {
					raw = n
				}
			}
			if s = lagSeries(t, m); ok(raw, s) {
				return
			}
		}
		t.Fatalf("%s: offsets' lag %d, series %q", what, raw, s)
	}
	zero := "onceflow_consumer_lag_messages{group=lag-txn-" + hex.EncodeToString(b) + ",partition=0,topic=" + topic + "} 0"
	waitFor("caught up", func(raw int64, s string) bool { return raw == 4 && s == zero })

	// Offset 7 is a record not acked yet and 8 its commit marker. The markers before them
	// still count as lag.
	txnProduce(t, p, topic, true, "d")
	select {
	case msg := <-ch:
		waitFor("one record in flight", func(raw int64, s string) bool { return raw == 6 && strings.HasSuffix(s, "} 6") })
		msg.Ack()
	case <-time.After(30 * time.Second):
		t.Fatal("no message d")
	}
	waitFor("caught up again", func(raw int64, s string) bool { return raw == 1 && s == zero })
}

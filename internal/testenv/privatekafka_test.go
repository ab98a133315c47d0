package testenv_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestPrivateKafkaStopStart: a private broker serves a topic, is stopped (its port then
// refuses connections and a producer fails), and comes back on the same port with the same
// data: the record written before the stop is read after the restart.
func TestPrivateKafkaStopStart(t *testing.T) {
	pk := testenv.StartPrivateKafka(t)
	k := pk.Config()
	topic := testenv.Topic(t, k, "private", 1)
	p, err := k.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("before")}); err != nil {
		t.Fatalf("produce before the stop: %v", err)
	}
	pk.Stop()
	if pk.Running() {
		t.Fatal("Running after Stop")
	}
	if c, err := net.DialTimeout("tcp", k.Brokers[0], time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after Stop", k.Brokers[0])
	}
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("during")}); err == nil {
		t.Fatal("produce while the broker is stopped succeeded")
	}
	_ = p.Close()
	pk.Start()
	if !pk.Running() {
		t.Fatal("not Running after Start")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs, err := k.ReadAll(ctx, topic, 2*time.Second)
	if err != nil {
		t.Fatalf("read after restart: %v", err)
	}
	if len(recs) != 1 || string(recs[0].Value) != "before" {
		t.Fatalf("after restart the topic holds %d records (%v), want the one written before the stop", len(recs), recs)
	}
}

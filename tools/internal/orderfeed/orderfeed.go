// Package orderfeed sends order-paid messages to a topic for the tools' end-to-end tests.
package orderfeed

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// Send produces one order-paid message per order id, keyed by it, each with a Watermill
// message id of its own (a repeated id is a duplicate delivery of that order).
func Send(t testing.TB, kc kafkax.Config, topic string, orders ...string) {
	t.Helper()
	p, err := kc.NewSyncProducer()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var msgs []*sarama.ProducerMessage
	for _, id := range orders {
		o := coupon.OrderPaid{OrderID: id, UserID: "u-" + id, AmountCents: 1990, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(id), Value: sarama.ByteEncoder(o.Encode()),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(watermill.NewUUID())}}})
	}
	if err := p.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
}

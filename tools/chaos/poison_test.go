package main

import (
	"bytes"
	"testing"

	"github.com/IBM/sarama"
)

// The checker tells the kinds `produce --poison` sends apart by their bytes alone.
func TestPoisonKindOf(t *testing.T) {
	order := []byte(`{"orderId":"p-poison-u8-3","userId":"u1","amountCents":100}`)
	for _, tc := range []struct {
		name string
		m    sarama.ConsumerMessage
	}{
		{"tombstone", sarama.ConsumerMessage{Key: []byte("poison-0")}},
		{"empty", sarama.ConsumerMessage{Key: []byte("poison-1"), Value: []byte{}}},
		{"bad-json", sarama.ConsumerMessage{Key: []byte("poison-2"), Value: []byte(`{"orderId": "p-bad", "userId": `)}},
		{"utf8-value", sarama.ConsumerMessage{Key: []byte("poison-3"), Value: []byte("\xff\xfe{\"userId\": \"u1\", \"amountCents\": 100}")}},
		{"utf8-key", sarama.ConsumerMessage{Key: []byte("\xff\xfepoison-4"), Value: []byte(`not json at all`)}},
		{"utf8-headers", sarama.ConsumerMessage{Key: []byte("poison-5"), Value: []byte(`not json at all`),
			Headers: []*sarama.RecordHeader{{Key: []byte("trace\xff"), Value: []byte("v")}}}},
		{"utf8-string", sarama.ConsumerMessage{Key: []byte("poison-6"), Value: bytes.Replace(order, []byte("u8-3"), []byte("u8-3\xff"), 1)}},
		{"oversized", sarama.ConsumerMessage{Key: []byte("poison-7"), Value: append(order, bytes.Repeat([]byte(" "), 65<<10)...)}},
	} {
		if got := poisonKindOf(&tc.m); got != tc.name {
			t.Errorf("%q: kind %s, want %s", tc.m.Value, got, tc.name)
		}
	}
}

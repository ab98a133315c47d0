package kafkax

import (
	"context"
	"reflect"
	"testing"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/internal/msgsource"
)

// unmarshal makes the message watermill-kafka's DefaultMarshaler makes, with fewer
// allocations.
func TestUnmarshalAsDefaultMarshaler(t *testing.T) {
	h := func(k, v string) *sarama.RecordHeader { return &sarama.RecordHeader{Key: []byte(k), Value: []byte(v)} }
	for _, tc := range []struct {
		name    string
		headers []*sarama.RecordHeader
		value   []byte
	}{
		{name: "no headers", value: []byte(`{"orderId":"o-1"}`)},
		{name: "id only", headers: []*sarama.RecordHeader{h(wkafka.UUIDHeaderKey, "id-1")}, value: []byte("x")},
		{name: "id and metadata", headers: []*sarama.RecordHeader{h("a", "1"), h(wkafka.UUIDHeaderKey, "id-1"), h("b", "")}, value: []byte("x")},
		{name: "repeated keys: the last wins", headers: []*sarama.RecordHeader{h("a", "1"), h("a", "2"), h(wkafka.UUIDHeaderKey, "id-1"), h(wkafka.UUIDHeaderKey, "id-2")}},
		{name: "invalid UTF-8 kept as is", headers: []*sarama.RecordHeader{h("k\xff", "v\xfe"), h(wkafka.UUIDHeaderKey, "\xff")}, value: []byte("\xff")},
		{name: "tombstone", headers: []*sarama.RecordHeader{h(wkafka.UUIDHeaderKey, "id-1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			km := &sarama.ConsumerMessage{Topic: "t", Key: []byte("k"), Value: tc.value, Headers: tc.headers}
			want, err := wkafka.DefaultMarshaler{}.Unmarshal(km)
			if err != nil {
				t.Fatal(err)
			}
			got := unmarshal(km, km.Value)
			if got.UUID != want.UUID || !reflect.DeepEqual(got.Metadata, want.Metadata) || !reflect.DeepEqual(got.Payload, want.Payload) {
				t.Errorf("unmarshal: %q %v %q, DefaultMarshaler: %q %v %q", got.UUID, got.Metadata, got.Payload, want.UUID, want.Metadata, want.Payload)
			}
			wantAllocs := testing.AllocsPerRun(100, func() { _, _ = wkafka.DefaultMarshaler{}.Unmarshal(km) })
			if a := testing.AllocsPerRun(100, func() { unmarshal(km, km.Value) }); a >= wantAllocs {
				t.Errorf("unmarshal: %.0f allocations, DefaultMarshaler: %.0f; want fewer", a, wantAllocs)
			}
		})
	}
}

// A message's context answers for its slot and for what its parent carries, is cancelled
// with its parent, and costs no allocation of its own.
func TestSlotContext(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	src := msgsource.Source{Topic: "t", Partition: 3, Offset: 42}
	sl := &slot{}
	sl.ctx = slotContext{Context: msgsource.With(parent, src), sl: sl}
	ctx := context.Context(&sl.ctx)
	if got, _ := ctx.Value(slotKey{}).(*slot); got != sl {
		t.Errorf("slot: %p, want %p", got, sl)
	}
	if got, ok := msgsource.From(ctx); !ok || got != src {
		t.Errorf("source: %+v %v, want %+v", got, ok, src)
	}
	child, stop := context.WithCancel(ctx)
	defer stop()
	cancel()
	<-child.Done()
	if ctx.Err() != context.Canceled {
		t.Errorf("err %v, want canceled", ctx.Err())
	}
	if a := testing.AllocsPerRun(100, func() {
		sl.ctx = slotContext{Context: parent, sl: sl}
		ctx = &sl.ctx
	}); a != 0 {
		t.Errorf("%.0f allocations for a message's context, want 0", a)
	}
}

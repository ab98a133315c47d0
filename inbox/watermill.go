package inbox

import (
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// HandlerFunc adapts the inbox to a Watermill router handler for messages consumed from
// topic. It returns nil (ack) once the delivery's outcome is committed, whatever it was,
// and an error (nack, redelivery) only when nothing could be recorded.
func (ib *Inbox) HandlerFunc(topic string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		src := Source{Topic: topic}
		if p, ok := wkafka.MessagePartitionFromCtx(ctx); ok {
			src.Partition = p
		}
		if o, ok := wkafka.MessagePartitionOffsetFromCtx(ctx); ok {
			src.Offset = o
		}
		_, err := ib.Process(ctx, msg, src, ProcessOptions{})
		return err
	}
}

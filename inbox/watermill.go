package inbox

import (
	"context"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/msgsource"
)

// HandlerFunc adapts the inbox to a Watermill router handler for messages consumed from
// topic. It returns nil (ack) once the delivery's outcome is committed, whatever it was,
// and an error (nack, redelivery) only when nothing could be recorded.
func (ib *Inbox) HandlerFunc(topic string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		_, err := ib.Process(msg.Context(), msg, SourceOf(msg, topic), ProcessOptions{})
		return err
	}
}

// ContextWithSource records where a message came from, for subscribers other than
// watermill-kafka's (which records it in its own context keys); kafkax.ParallelSubscriber
// sets it.
func ContextWithSource(ctx context.Context, src Source) context.Context {
	return msgsource.With(ctx, msgsource.Source(src))
}

// SourceOf returns where msg was consumed from: the Source set by ContextWithSource, else
// watermill-kafka's partition and offset, with topic as the topic.
func SourceOf(msg *message.Message, topic string) Source {
	ctx := msg.Context()
	if ms, ok := msgsource.From(ctx); ok {
		s := Source(ms)
		if s.Topic == "" {
			s.Topic = topic
		}
		return s
	}
	src := Source{Topic: topic}
	if p, ok := wkafka.MessagePartitionFromCtx(ctx); ok {
		src.Partition = p
	}
	if o, ok := wkafka.MessagePartitionOffsetFromCtx(ctx); ok {
		src.Offset = o
	}
	return src
}

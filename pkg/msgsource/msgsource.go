// Package msgsource records where a consumed message came from (topic, partition, offset)
// in its context: subscribers set it, the inbox reads it. It sits in pkg so that a
// subscriber (pkg/kafkax) and the inbox share it without importing each other.
package msgsource

import "context"

// Source is where a delivery came from.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

type key struct{}

// With returns ctx carrying src.
func With(ctx context.Context, src Source) context.Context {
	return context.WithValue(ctx, key{}, src)
}

// From returns the Source ctx carries, if any.
func From(ctx context.Context) (Source, bool) {
	s, ok := ctx.Value(key{}).(Source)
	return s, ok
}

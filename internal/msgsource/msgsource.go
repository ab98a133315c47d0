// Package msgsource records in a consumed message's context where the message came from,
// by topic, partition and offset. Subscribers set it, and the inbox reads it as
// inbox.Source. It is a package of its own, so that a subscriber such as pkg/kafkax and the
// inbox share it without importing each other.
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

// CutPrefixBytes is how much of a record value over the consumer's limit is kept when it
// is cut. See Cut.
const CutPrefixBytes = 64 << 10

// Cut records that a subscriber cut a record's value before the record waited to be
// handled, because it was over the limit that the inbox refuses anyway. The message's
// payload holds only the value's first bytes, at most CutPrefixBytes. Cut holds the value's
// original size and sha256, with which the inbox quarantines it.
type Cut struct {
	Size   int
	SHA256 [32]byte
}

type cutKey struct{}

// WithCut returns ctx carrying c.
func WithCut(ctx context.Context, c Cut) context.Context {
	return context.WithValue(ctx, cutKey{}, c)
}

// CutFrom returns the Cut ctx carries, if any.
func CutFrom(ctx context.Context) (Cut, bool) {
	c, ok := ctx.Value(cutKey{}).(Cut)
	return c, ok
}

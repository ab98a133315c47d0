package outbox

import (
	"encoding/binary"

	"github.com/google/uuid"
)

// eventIDSpace is the UUID namespace of EventID. It never changes: ids already stored and
// published depend on it.
var eventIDSpace = uuid.MustParse("082f12a1-1222-4e0c-87a8-b73f96503706")

// EventID returns a stable event id made of parts, such as the event's type and the business
// key it is about. The id is a version 5 UUID, the SHA-1 of the parts in a namespace of the
// outbox's. It is 36 bytes however long the parts are. The same parts give the same id in
// every process and every version of onceflow. So an event written again by a retry or a
// replay keeps its id. Parts that differ in content, number or order give different ids.
// Each part is hashed with its length, so the parts "ab" and "c" make another name than
// "a" and "bc".
//
//	outbox.Event{ID: outbox.EventID("PointsCredited", orderID), …}
func EventID(parts ...string) string {
	n := 0
	for _, p := range parts {
		n += binary.MaxVarintLen64 + len(p)
	}
	name := make([]byte, 0, n)
	for _, p := range parts {
		name = binary.AppendUvarint(name, uint64(len(p)))
		name = append(name, p...)
	}
	return uuid.NewSHA1(eventIDSpace, name).String()
}

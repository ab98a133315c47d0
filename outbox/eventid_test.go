package outbox_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/outbox"
)

// EventID is a valid event id whatever the length of its parts, the same for the same parts,
// and another for parts that differ in content, number, order or where one ends.
func TestEventID(t *testing.T) {
	long := strings.Repeat("o", 64) // the inbox's longest key
	id := outbox.EventID("PointsCredited", long)
	e := validEvent()
	e.ID = id
	if err := e.Validate(); err != nil || len(id) != 36 {
		t.Fatalf("EventID of a 64-byte key: %q (%d bytes), %v; want a valid 36-byte id", id, len(id), err)
	}
	if again := outbox.EventID("PointsCredited", long); again != id {
		t.Fatalf("EventID gave %q, then %q for the same parts", id, again)
	}
	seen := map[string][]string{}
	for _, parts := range [][]string{
		{"PointsCredited", long}, {"PointsCredited", long + " "}, {"PointsDebited", long},
		{long, "PointsCredited"}, {"PointsCredited"}, {"PointsCredited", long, ""},
		{"ab", "c"}, {"a", "bc"}, {"abc"}, {"a\x00", "bc"}, {}, {""}, {"", ""},
		{strings.Repeat("x", 10000)},
	} {
		id := outbox.EventID(parts...)
		if other, dup := seen[id]; dup {
			t.Errorf("EventID(%q) = EventID(%q) = %s", parts, other, id)
		}
		seen[id] = parts
		if len(id) != 36 {
			t.Errorf("EventID(%q) = %q, %d bytes", parts, id, len(id))
		}
	}
}

// A stable event id from the event's type and its business key: the same id whenever the
// order's event is written again, 36 bytes however long the order id is.
func ExampleEventID() {
	fmt.Println(outbox.EventID("PointsCredited", "o-1"))
	fmt.Println(outbox.EventID("PointsCredited", "o-1"))
	fmt.Println(outbox.EventID("PointsCredited", "o-2"))
	fmt.Println(len(outbox.EventID("PointsCredited", strings.Repeat("o", 64))))
	// Output:
	// 8b901998-6342-5560-9acd-6161f49c9a9e
	// 8b901998-6342-5560-9acd-6161f49c9a9e
	// ce1db402-5895-59ea-9f62-26118f05bd26
	// 36
}

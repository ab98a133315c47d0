package outbox

import (
	"context"
	"fmt"
	"testing"
)

// AddBatch's arguments are rowArgs' of each event, in one slice, a type and topic boxed
// once while they repeat: three allocations per event (id, key, payload), not seven and a
// slice of its own.
func TestBatchArgs(t *testing.T) {
	ctx := context.Background()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	evs := make([]Event, 100)
	for i := range evs {
		evs[i] = Event{ID: fmt.Sprintf("e%d", i), Type: "T", Topic: "orders", Key: fmt.Sprintf("k%d", i), Payload: []byte("p")}
		if i%10 == 9 {
			evs[i].Type, evs[i].Topic, evs[i].TraceParent = "U", "other", tp
			evs[i].Headers = map[string]string{"b": "2", "a": "1"}
		}
	}
	evs[5].Payload = nil
	args, err := batchArgs(ctx, evs)
	if err != nil {
		t.Fatal(err)
	}
	var want []any
	for _, e := range evs {
		row, err := rowArgs(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, row...)
	}
	if g, w := fmt.Sprintf("%#v", args), fmt.Sprintf("%#v", want); g != w {
		t.Fatalf("batch args\n%s\nwant\n%s", g, w)
	}
	if _, err := batchArgs(ctx, []Event{evs[0], {ID: "bad"}}); err == nil {
		t.Fatal("an invalid event was accepted")
	}

	same := evs[:8]
	const most = 3
	if allocs := testing.AllocsPerRun(50, func() { _, _ = batchArgs(ctx, same) }); allocs > most*float64(len(same))+3 {
		t.Errorf("%.0f allocations for %d events, want at most %d per event, the slice and the first type and topic", allocs, len(same), most)
	}
}

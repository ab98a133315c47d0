package chanx

import "testing"

// TestTrySend: it sends when the channel has room and stop is open, and never blocks or
// sends otherwise.
func TestTrySend(t *testing.T) {
	open, closed := make(chan struct{}), make(chan struct{})
	close(closed)
	for _, tc := range []struct {
		name string
		room int
		stop chan struct{}
		want bool
	}{{"room", 1, open, true}, {"full", 0, open, false}, {"stopped", 1, closed, false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := make(chan int, tc.room)
			if got := TrySend(c, 7, tc.stop); got != tc.want || len(c) != map[bool]int{true: 1}[tc.want] {
				t.Fatalf("TrySend = %v with %d queued, want %v", got, len(c), tc.want)
			}
		})
	}
}

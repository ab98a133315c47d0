package chaosplan

import (
	"fmt"
	"testing"
)

// The shares hold over order ids shaped like the producer's, and For is a pure function.
func TestShares(t *testing.T) {
	const n = 100_000
	count := map[Behaviour]int{}
	for i := range n {
		id := fmt.Sprintf("chaos1-1796223540-s%02d-%06d", i%20, i)
		b := For(id)
		if For(id) != b {
			t.Fatalf("For(%q) is not stable", id)
		}
		count[b]++
	}
	for b, want := range map[Behaviour]int{Panic: PanicPerMille * n / 1000, Block: BlockPerMille * n / 1000} {
		if got := count[b]; got < want*8/10 || got > want*12/10 {
			t.Errorf("%s: %d of %d orders, want about %d", b, got, n, want)
		}
	}
}

package kafkax

import "context"

// BudgetAcquire and BudgetRelease expose the budget's charge for its tests.
func BudgetAcquire(b *Budget, ctx context.Context, n int64) int64 { return b.acquire(ctx, n) }
func BudgetRelease(b *Budget, n int64)                            { b.release(n) }

// Told reports whether AckOnReturn has told any claim of sub of an ack or nack.
func Told(sub *ParallelSubscriber) bool {
	sub.claimsMu.Lock()
	defer sub.claimsMu.Unlock()
	for r := range sub.claims {
		if r.told.Load() {
			return true
		}
	}
	return false
}

// FetchMin is the fetch.min.bytes of sub's consumer.
func FetchMin(sub *ParallelSubscriber) int32 { return sub.sarama.Consumer.Fetch.Min }

// SaramaQueued is how many records Sarama holds in its channels of sub's claims, read from
// Kafka and not yet taken by the claims.
func SaramaQueued(sub *ParallelSubscriber) int {
	sub.claimsMu.Lock()
	defer sub.claimsMu.Unlock()
	n := 0
	for r := range sub.claims {
		n += len(r.claim.Messages())
	}
	return n
}

// Sweeps is how many times sub's claims have swept their windows for acks.
func Sweeps(sub *ParallelSubscriber) int64 { return sub.sweeps.Load() }

// IdlePaused is how many of sub's claims the idler holds paused now.
func IdlePaused(sub *ParallelSubscriber) int {
	sub.claimsMu.Lock()
	defer sub.claimsMu.Unlock()
	n := 0
	for r := range sub.claims {
		r.idleMu.Lock()
		if r.idle.paused {
			n++
		}
		r.idleMu.Unlock()
	}
	return n
}

// WithoutAckedMetadata makes sub write and read no acked messages past its committed
// offsets, as before they were written. Call it before Subscribe.
func WithoutAckedMetadata(sub *ParallelSubscriber) { sub.noAckedMetadata = true }

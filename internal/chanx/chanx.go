// Package chanx has channel helpers for paths every message takes.
package chanx

// TrySend sends v on c if c can take it at once (room in its buffer, or a receiver
// waiting) and stop is not closed, without blocking. A send alone locks one channel where a
// select over c, stop and more locks them all; false leaves the decision to the caller's
// blocking select, which, like this, may pick any of its ready cases.
func TrySend[T any](c chan<- T, v T, stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	default:
	}
	select {
	case c <- v:
		return true
	default:
		return false
	}
}

// Package chanx has channel helpers for paths every message takes.
package chanx

// TrySend sends v on c without blocking, if c can take it at once and stop is not closed.
// c can take it when its buffer has room or a receiver waits. A send alone locks one
// channel, where a select over c, stop and more locks them all. When TrySend returns false,
// the caller's blocking select decides. Like TrySend, that select may pick any of its ready
// cases.
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

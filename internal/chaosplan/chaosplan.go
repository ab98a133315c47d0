// Package chaosplan decides, from an order id alone, how the chaos harness's misbehaving
// plugin treats that order. The plugin in tools/chaosrouter/chaosplugin.go and the harness's
// checker in tools/chaos both call For. So the checker knows which orders must end
// quarantined, and why, without asking the router.
package chaosplan

import "hash/fnv"

// Behaviour is what the misbehaving plugin does with one order.
type Behaviour int

const (
	// Behave makes the handler return Done at once. The inbox row ends 'done'.
	Behave Behaviour = iota
	// Panic makes the handler panic on every attempt. The row ends 'failed' with reason
	// panic.
	Panic
	// Block makes the handler never return and ignore its context. Every attempt is
	// abandoned after inbox.handler_timeout, and the row ends 'failed' with reason timeout.
	Block
)

// Shares of the orders, per mille of the hash space.
const (
	PanicPerMille = 20 // 2 %
	BlockPerMille = 5  // 0.5 %
)

// For returns the behaviour for orderID. It takes the FNV-1a 64 hash of the id, modulo
// 1000. Values below PanicPerMille panic, the next BlockPerMille block, and the rest behave.
func For(orderID string) Behaviour {
	h := fnv.New64a()
	h.Write([]byte(orderID))
	switch n := h.Sum64() % 1000; {
	case n < PanicPerMille:
		return Panic
	case n < PanicPerMille+BlockPerMille:
		return Block
	}
	return Behave
}

// String is the inbox outcome b leads to. It is "done", or the quarantine reason "panic" or
// "timeout".
func (b Behaviour) String() string {
	switch b {
	case Panic:
		return "panic"
	case Block:
		return "timeout"
	}
	return "done"
}

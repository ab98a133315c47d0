// Package chaosplan decides, from an order id alone, how the chaos harness's misbehaving
// plugin treats that order. The plugin (tools/chaosrouter/chaosplugin.go) and the harness's
// checker (tools/chaos) both call For, so the checker knows which orders must end
// quarantined, and why, without asking the router.
package chaosplan

import "hash/fnv"

// Behaviour is what the misbehaving plugin does with one order.
type Behaviour int

const (
	// Behave: the handler returns Done at once; the inbox row ends 'done'.
	Behave Behaviour = iota
	// Panic: the handler panics on every attempt; the row ends 'failed' with reason panic.
	Panic
	// Block: the handler never returns and ignores its context; every attempt is abandoned
	// after inbox.handler_timeout and the row ends 'failed' with reason timeout.
	Block
)

// Shares of the orders, per mille of the hash space.
const (
	PanicPerMille = 20 // 2 %
	BlockPerMille = 5  // 0.5 %
)

// For returns the behaviour for orderID: FNV-1a 64 of the id, modulo 1000, below
// PanicPerMille panics, the next BlockPerMille block, the rest behave.
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

// String is the inbox outcome b leads to: "done", or the quarantine reason ("panic",
// "timeout").
func (b Behaviour) String() string {
	switch b {
	case Panic:
		return "panic"
	case Block:
		return "timeout"
	}
	return "done"
}

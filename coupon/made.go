package coupon

import "sync"

// madeCalls remembers the outside calls of grant steps that succeeded in this process. It
// keeps their idempotency keys, made of the order id and the step. Prepare makes every call
// still due before the grant's transaction. When a later call fails, or the transaction
// rolls back, nothing of the grant commits, and the next attempt would call the earlier
// steps again. The downstream would recognise them by their keys, but a call that succeeded
// is not made twice from here. The set is bounded, and the oldest key is forgotten first.
type madeCalls struct {
	mu   sync.Mutex
	set  map[string]struct{}
	ring []string
	next int
}

// madeCallsKept is how many calls the set remembers. It holds the calls of the grants in
// flight, a few per order.
const madeCallsKept = 1 << 15

func newMadeCalls(n int) *madeCalls {
	return &madeCalls{set: make(map[string]struct{}), ring: make([]string, n)}
}

func (m *madeCalls) has(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.set[key]
	return ok
}

func (m *madeCalls) add(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.set[key]; ok {
		return
	}
	if old := m.ring[m.next]; old != "" {
		delete(m.set, old)
	}
	m.ring[m.next] = key
	m.set[key] = struct{}{}
	m.next = (m.next + 1) % len(m.ring)
}

// forget drops keys. A grant that reached its end needs none of its calls again.
func (m *madeCalls) forget(keys ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		delete(m.set, k) // its ring slot is reused in turn
	}
}

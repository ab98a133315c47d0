package outbox

import "testing"

// TestPositionsReplicas: what the relay requires of the positions topic, and creates it
// with, for each cluster size and relay.positions_min_replicas.
func TestPositionsReplicas(t *testing.T) {
	for _, c := range []struct{ min, brokers, need, create int }{
		{3, 1, 1, 1}, // the one-broker services: any topic
		{3, 2, 2, 2},
		{3, 3, 3, 3}, // a cluster of three: RF 3 required
		{3, 5, 3, 3},
		{1, 3, 1, 3}, // told otherwise: an RF 1 topic accepted, a new one still gets 3
		{5, 6, 5, 5},
		{5, 4, 4, 4},
	} {
		need, create := positionsReplicas(c.min, c.brokers)
		if need != c.need || create != c.create {
			t.Errorf("min %d on %d brokers: need %d, create %d; want %d, %d", c.min, c.brokers, need, create, c.need, c.create)
		}
	}
	if err := (RelayConfig{PositionsMinReplicas: -1}).WithDefaults().Validate(); err == nil {
		t.Error("positions min replicas -1 accepted")
	}
	if c := (RelayConfig{}).WithDefaults(); c.PositionsMinReplicas != 3 {
		t.Errorf("default positions min replicas %d, want 3", c.PositionsMinReplicas)
	}
}

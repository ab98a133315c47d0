package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

// TestEOSRelayLeaseTakeovers: LeaseTakeovers counts the leases a relay takes, not its
// renewals, nor its turns as a standby: A takes the free lease, renews it, releases it; B
// takes it; A takes it back once B released it. The relay_lease row's own takeovers column
// agrees (owner changes).
func TestEOSRelayLeaseTakeovers(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	d := testenv.DB(t, 8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-takeovers", 1)
	cfg := eosConfig(t, k, outbox.RelayConfig{})
	cfgA, cfgB := cfg, cfg
	cfgA.Owner, cfgB.Owner = "relay-a", "relay-b"
	a, b := newEOSRelay(t, d.DB, k, cfgA), newEOSRelay(t, d.DB, k, cfgB)
	ctx := context.Background()
	step := func(name string, r *outbox.Relay, wantOwner bool) {
		t.Helper()
		addN(t, d.DB, topic, name, 1)
		if _, err := r.RelayOnce(ctx); err != nil || r.Owner() != wantOwner {
			t.Fatalf("%s: RelayOnce: %v, owner %v; want nil, %v", name, err, r.Owner(), wantOwner)
		}
	}
	check := func(when string, wantA, wantB int64) {
		t.Helper()
		if a.LeaseTakeovers() != wantA || b.LeaseTakeovers() != wantB {
			t.Fatalf("%s: takeovers A %d, B %d; want %d, %d", when, a.LeaseTakeovers(), b.LeaseTakeovers(), wantA, wantB)
		}
	}

	step("a-first", a, true)
	check("A took the free lease", 1, 0)
	step("b-standby", b, false)
	check("B stood by", 1, 0)
	time.Sleep(cfg.LeaseTTL/4 + 100*time.Millisecond) // A's lease is due for renewal
	step("a-renewed", a, true)
	check("A renewed", 1, 0)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	step("b-took", b, true)
	check("B took the released lease", 1, 1)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	step("a-back", a, true)
	check("A took it back", 2, 1)

	var owner string
	var column int64
	if err := d.DB.QueryRow("SELECT owner, takeovers FROM relay_lease").Scan(&owner, &column); err != nil {
		t.Fatal(err)
	}
	if owner != "relay-a" || column != 3 {
		t.Fatalf("relay_lease: owner %q, takeovers %d; want relay-a, 3 (the same changes of owner)", owner, column)
	}
	if n := pendingRows(t, d.DB); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
}

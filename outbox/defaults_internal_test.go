package outbox

import (
	"testing"
	"time"
)

// TestRelayConfigDefaultsAreTheRouters pins the relay's defaults: the stock router's relay.*
// defaults are read from them (the runtime's config.go), so a relay wired by hand runs as
// the router's.
func TestRelayConfigDefaultsAreTheRouters(t *testing.T) {
	var c RelayConfig
	c.setDefaults()
	want := RelayConfig{Table: "outbox", BatchSize: 10000, BatchBytes: 16 << 20, Linger: 5 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		RetryBackoff: time.Second, MaxRetryBackoff: 5 * time.Second, LagBound: time.Minute,
		Retention: 7 * 24 * time.Hour, CleanupInterval: time.Minute, CleanupBatch: 500, Shard: "default", Shards: 1,
		PositionsTopic: DefaultPositionsTopic, LeaseTTL: 10 * time.Second, TxnTimeout: 30 * time.Second}
	c.Owner = "" // host-pid-random, as the router's
	if c.TransactionalID != "" {
		t.Fatalf("default transactional id %q set before the database is known", c.TransactionalID)
	}
	if c.Table != want.Table || c.BatchSize != want.BatchSize || c.BatchBytes != want.BatchBytes || c.Linger != want.Linger || c.PollInterval != want.PollInterval ||
		c.RetryBackoff != want.RetryBackoff || c.MaxRetryBackoff != want.MaxRetryBackoff || c.LagBound != want.LagBound ||
		c.CleanupInterval != want.CleanupInterval || c.CleanupBatch != want.CleanupBatch || c.Shard != want.Shard ||
		c.Shards != want.Shards || c.PositionsTopic != want.PositionsTopic || c.LeaseTTL != want.LeaseTTL ||
		c.TxnTimeout != want.TxnTimeout || c.Retention != want.Retention || c.PositionsMinReplicas != 3 {
		t.Fatalf("defaults\n got %+v\nwant %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	// Validate only checks: the zero config is invalid until its defaults are filled.
	if err := (RelayConfig{}).Validate(); err == nil {
		t.Fatal("the zero config validates: Validate filled in defaults")
	}
	if err := (RelayConfig{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("WithDefaults().Validate() = %v", err)
	}
	// KeepPublished (any negative value) keeps published rows; the zero value is the default.
	keep := RelayConfig{Retention: KeepPublished}.WithDefaults()
	if keep.Retention >= 0 || keep.Validate() != nil {
		t.Fatalf("KeepPublished became %s (%v)", keep.Retention, keep.Validate())
	}
	// NoLinger (any negative value) turns lingering off; the zero value is the default.
	off := RelayConfig{Linger: NoLinger}
	off.setDefaults()
	if off.Linger >= 0 || off.Validate() != nil {
		t.Fatalf("NoLinger became %s (%v)", off.Linger, off.Validate())
	}
}

func TestShardTxnID(t *testing.T) {
	cases := []struct {
		i, n int
		want string
	}{{0, 1, "g"}, {0, 2, "g-0of2"}, {3, 4, "g-3of4"}}
	for _, c := range cases {
		if got := shardTxnID("g", c.i, c.n); got != c.want {
			t.Errorf("shardTxnID(g, %d, %d) = %q, want %q", c.i, c.n, got, c.want)
		}
	}
	if got := DefaultTransactionalID("shop", "default"); got != "onceflow-relay-shop-default" {
		t.Errorf("DefaultTransactionalID = %q", got)
	}
}

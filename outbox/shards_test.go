package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
)

func TestShardName(t *testing.T) {
	if got := outbox.ShardName("default", 0, 1); got != "default" {
		t.Errorf("one shard: %q, want the group name (the lease and transactional id of an unsharded relay)", got)
	}
	if got := outbox.ShardName("default", 2, 4); got != "default#2/4" {
		t.Errorf("shard 2 of 4: %q", got)
	}
}

// addKeyed commits one event per key, n keys, in one transaction.
func addKeyed(t *testing.T, d testenv.Database, topic, prefix string, n int) []string {
	t.Helper()
	var ids []string
	var evs []outbox.Event
	for i := range n {
		id := fmt.Sprintf("%s-%03d", prefix, i)
		ids = append(ids, id)
		evs = append(evs, outbox.Event{ID: id, Type: "T", Topic: topic, Key: fmt.Sprintf("key-%d", i), Payload: []byte(id)})
	}
	addCommitted(t, context.Background(), d.DB, newWriter(t), evs...)
	return ids
}

// TestEOSShardedRelayPublishesEachShardInItsOwnTransactions runs one relay that owns all of
// its three shards. Every Kafka transaction, told by its batch position, covers rows of one
// shard only, with the shard's own transactional id. MOD(key_hash, 3) of each of its rows is
// the shard in the position. Every event is on Kafka once.
func TestEOSShardedRelayPublishesEachShardInItsOwnTransactions(t *testing.T) {
	t.Parallel()
	d := testenv.DB(t, 8)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-shards", 3)
	cfg := eosConfig(t, k, outbox.RelayConfig{Shards: 3, BatchSize: 7, Owner: "solo"})
	r := newEOSRelay(t, d.DB, k, cfg)
	ids := addKeyed(t, d, topic, "sh", 60)
	ctx := context.Background()
	for published := 0; published < len(ids); {
		n, err := r.RelayOnce(ctx)
		if err != nil {
			t.Fatalf("RelayOnce: %v", err)
		}
		if n == 0 {
			t.Fatalf("RelayOnce published nothing with %d of %d events published", published, len(ids))
		}
		published += n
	}
	if got := r.OwnedShards(); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("owned shards %v, want [0 1 2] (the only member)", got)
	}
	batches := 0
	for _, rec := range readAll(t, k, cfg.PositionsTopic) {
		if strings.HasSuffix(rec.Key, "/init") {
			continue
		}
		var p outbox.Position
		if err := json.Unmarshal(rec.Value, &p); err != nil {
			t.Fatalf("position %q: %v", rec.Value, err)
		}
		var shard int
		if _, err := fmt.Sscanf(p.Shard, "default#%d/3", &shard); err != nil || p.TxnID != fmt.Sprintf("%s-%dof3", cfg.TransactionalID, shard) || rec.Key != p.TxnID {
			t.Fatalf("position of shard %q, transactional id %q, key %q: want default#i/3, %s-<i>of3", p.Shard, p.TxnID, rec.Key, cfg.TransactionalID)
		}
		for _, rg := range p.IDs {
			var other int
			if err := d.DB.QueryRow(rebind(d.DB, "SELECT COUNT(*) FROM outbox WHERE id BETWEEN ? AND ? AND MOD(key_hash, 3) <> ?"), rg[0], rg[1], shard).Scan(&other); err != nil {
				t.Fatal(err)
			}
			if other != 0 {
				t.Fatalf("batch of shard %d covers ids %d..%d, %d of which belong to another shard", shard, rg[0], rg[1], other)
			}
		}
		batches++
	}
	if batches < 3 {
		t.Fatalf("%d batch positions, want at least one per shard", batches)
	}
	assertExactlyOnce(t, readAll(t, k, topic), ids)
}

// TestEOSShardCountMismatchRefuses shows why relays of one group must share a shard count.
// With different counts they would publish the same rows under different transactional
// ids, which Kafka does not fence. Two groups, with no guard between them, show it. The
// second relay runs while the first has committed its batch to Kafka but not yet marked it,
// and publishes the same events again. In one group, the second relay refuses with
// ErrShardCountMismatch and publishes nothing. Every event is on Kafka once.
func TestEOSShardCountMismatchRefuses(t *testing.T) {
	t.Parallel()
	for _, sameGroup := range []bool{false, true} {
		t.Run(fmt.Sprint("same_group=", sameGroup), func(t *testing.T) {
			d := testenv.DB(t, 8)
			k := testenv.Kafka(t)
			topic := testenv.Topic(t, k, "outbox-mismatch", 2)
			one := eosConfig(t, k, outbox.RelayConfig{Owner: "one-shard"})
			two := eosConfig(t, k, outbox.RelayConfig{Owner: "two-shards", Shards: 2, PositionsTopic: one.PositionsTopic,
				TransactionalID: one.TransactionalID + "-two"})
			if !sameGroup {
				two.Shard = "other"
			}
			second := newEOSRelay(t, d.DB, k, two)
			var secondN int
			var secondErr error
			one.Hook = func(point string) {
				if point == "after-kafka-commit" {
					secondN, secondErr = second.RelayOnce(context.Background())
				}
			}
			first := newEOSRelay(t, d.DB, k, one)
			ids := addKeyed(t, d, topic, "mm", 20)
			if n, err := first.RelayOnce(context.Background()); n != 20 || err != nil {
				t.Fatalf("first relay: RelayOnce = %d, %v; want 20", n, err)
			}
			recs := readAll(t, k, topic)
			if !sameGroup {
				if secondN == 0 || len(exactlyOnceProblems(recs, ids)) == 0 {
					t.Fatalf("two groups: the second relay published %d (%v) and Kafka holds %d records for %d events; want duplicates (the hazard)", secondN, secondErr, len(recs), len(ids))
				}
				t.Logf("two groups over one table: %d records on Kafka for %d events (what the guard prevents)", len(recs), len(ids))
				return
			}
			if !errors.Is(secondErr, outbox.ErrShardCountMismatch) || secondN != 0 {
				t.Fatalf("second relay (2 shards) while a 1-shard relay holds the group: RelayOnce = %d, %v; want 0, ErrShardCountMismatch", secondN, secondErr)
			}
			t.Logf("refused: %v", secondErr)
			assertExactlyOnce(t, recs, ids)
		})
	}
}

// liveShardOwners maps each live lease of group#i/n to its owner.
func liveShardOwners(t *testing.T, d testenv.Database, n int) map[int]string {
	t.Helper()
	rows, err := d.DB.Query("SELECT shard, owner FROM relay_lease WHERE expires_at > CURRENT_TIMESTAMP(6)")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var shard, owner string
		if err := rows.Scan(&shard, &owner); err != nil {
			t.Fatal(err)
		}
		var i, m int
		if _, err := fmt.Sscanf(shard, "default#%d/%d", &i, &m); err == nil && m == n {
			out[i] = owner
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func countOwned(owners map[int]string, owner string) int {
	n := 0
	for _, o := range owners {
		if o == owner {
			n++
		}
	}
	return n
}

// TestEOSShardedRelaysSplitAndTakeOver starts two `router relay` processes with
// relay.shards=4 while business transactions keep committing. They split the shards two
// and two in relay_member, each publishing its own. One gets SIGKILL. The other takes its
// two shards once their leases and its membership have expired. The lease TTL is 2s, and
// the time is logged, not asserted. Every event reaches Kafka once, each key in order.
func TestEOSShardedRelaysSplitAndTakeOver(t *testing.T) {
	t.Parallel()
	const shards = 4
	d := testenv.DB(t, 12)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "outbox-sharded", 4)
	positions := testenv.Topic(t, k, "relay-positions-sharded", 1)
	txnID := "test-sharded-" + topic

	writers := startPacedWriters(t, d.DB, topic, 4, 5*time.Millisecond)
	procs := map[string]*relayProc{}
	for _, name := range []string{"relay-a", "relay-b"} {
		procs[name] = startRelayProc(t, name, relayEnv(d, k, txnID, positions, name, map[string]string{"ONCEFLOW_RELAY_SHARDS": fmt.Sprint(shards)}))
	}
	tails := func() string { return procs["relay-a"].tail(t, 15) + "\n----\n" + procs["relay-b"].tail(t, 15) }
	deadline := time.Now().Add(30 * time.Second)
	for {
		o := liveShardOwners(t, d, shards)
		// Each relay owns two shards and has started a session on both, so it may publish.
		if countOwned(o, "relay-a") == 2 && countOwned(o, "relay-b") == 2 && countRows(t, d.DB, "published_at IS NOT NULL") > 200 &&
			countLines(procs["relay-a"].logText(t), "outbox relay session started") >= 2 &&
			countLines(procs["relay-b"].logText(t), "outbox relay session started") >= 2 {
			t.Logf("split: %v", o)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two relays did not split the %d shards two and two within 30s (owners %v):\n%s", shards, o, tails())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Log("killing relay-a with SIGKILL")
	procs["relay-a"].kill()
	<-procs["relay-a"].done
	killed := time.Now()
	var takeover time.Duration
	for {
		if o := liveShardOwners(t, d, shards); countOwned(o, "relay-b") == shards {
			takeover = time.Since(killed)
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("relay-b did not take all %d shards within 30s (owners %v):\n%s", shards, liveShardOwners(t, d, shards), procs["relay-b"].tail(t, 30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The design bound is the lease TTL of 2s, one membership refresh of TTL/4 and the
	// standby poll. It is logged.
	t.Logf("relay-b owns all %d shards %s after the kill (design bound ≈ %s)", shards, takeover.Round(time.Millisecond), 2*time.Second+time.Second)
	time.Sleep(500 * time.Millisecond)
	ids := writers.finish(t)
	waitAllPublished(t, d.DB, len(ids), 60*time.Second)
	recs := readAll(t, k, topic)
	assertExactlyOnce(t, recs, ids)
	assertPerKeyOrder(t, d.DB, recs)
}

func TestRelayConfigShards(t *testing.T) {
	for _, c := range []struct {
		cfg outbox.RelayConfig
		ok  bool
	}{
		{outbox.RelayConfig{}, true},
		{outbox.RelayConfig{Shards: 256}, true},
		{outbox.RelayConfig{Shards: 257}, false},
		{outbox.RelayConfig{Shards: -2}, false},
		{outbox.RelayConfig{Shard: "g/1"}, false},
		{outbox.RelayConfig{Shard: strings.Repeat("s", 53)}, false},
	} {
		if err := c.cfg.WithDefaults().Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(shard %q, shards %d) = %v, want ok=%v", c.cfg.Shard, c.cfg.Shards, err, c.ok)
		}
	}
}

package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// TestRelayLateCommitInsideBatchRange has a transaction take an outbox id between rows that
// commit around it, ids 1..4 before and 6..9 after. The ids come from an identity on
// PostgreSQL and an auto-increment on MariaDB. Both are allocated at the insert, never in
// commit order. The transaction stays open while the relay reads the rows on both sides of
// it as one batch. It commits while that batch is in Kafka and not yet marked. The mark
// names the ranges 1..4 and 6..9, never 1..9, and so does the position in exactly-once
// mode. Row 5 stays pending, and the next batch publishes it. At READ COMMITTED each
// statement of the relay reads what committed before it began. So the open row is neither
// seen nor waited for. A mark of the batch's whole id span would mark row 5 published
// without sending it, and this test would then fail.
func TestRelayLateCommitInsideBatchRange(t *testing.T) {
	k := testenv.Kafka(t)
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			d := testenv.DB(t, 4)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			topic := testenv.Topic(t, k, "outbox-gap-range", 1)
			late, err := d.DB.BeginTx(ctx, dbx.TxOptions)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = late.Rollback() }()
			var (
				hookMu     sync.Mutex
				lateCommit error
				committed  bool
			)
			// Row 5 commits after the batch around it was read and sent, before its mark.
			cfg := outbox.RelayConfig{Hook: func(point string) {
				hookMu.Lock()
				defer hookMu.Unlock()
				if point == "after-kafka-commit" && !committed {
					committed, lateCommit = true, late.Commit()
				}
			}}
			var (
				relay     *outbox.Relay
				positions string
			)
			if mode == "exactly-once" {
				cfg = eosConfig(t, k, cfg)
				positions = cfg.PositionsTopic
				relay = newEOSRelay(t, d.DB, k, cfg)
			} else {
				relay = newRelay(t, d.DB, newProducer(t, k), cfg)
			}
			w := newWriter(t)
			ev := func(i int) outbox.Event {
				return outbox.Event{ID: fmt.Sprintf("r-%d", i), Type: "T", Topic: topic, Key: fmt.Sprintf("k%d", i), Payload: []byte{byte(i)}}
			}
			var want []string
			for i := 1; i <= 4; i++ {
				addCommitted(t, ctx, d.DB, w, ev(i))
				want = append(want, ev(i).ID)
			}
			if err := w.Add(ctx, late, ev(5)); err != nil {
				t.Fatal(err)
			}
			for i := 6; i <= 9; i++ {
				addCommitted(t, ctx, d.DB, w, ev(i))
				want = append(want, ev(i).ID)
			}
			var lateID int64
			if err := late.QueryRowContext(ctx, rebind(d.DB, "SELECT id FROM outbox WHERE event_id = ?"), ev(5).ID).Scan(&lateID); err != nil {
				t.Fatal(err)
			}
			if lateID != 5 || countRows(t, d.DB, "id BETWEEN 1 AND 9") != 8 {
				t.Fatalf("scenario broken: the open row has id %d, want 5 between eight committed rows", lateID)
			}

			relayOnce := func(want int) {
				t.Helper()
				rctx, rcancel := context.WithTimeout(ctx, 20*time.Second) // a relay waiting for row 5's lock would hang
				defer rcancel()
				if n, err := relay.RelayOnce(rctx); n != want || err != nil {
					t.Fatalf("RelayOnce = %d, %v; want %d, nil", n, err, want)
				}
			}
			relayOnce(8)
			hookMu.Lock()
			ok, cerr := committed, lateCommit
			hookMu.Unlock()
			if !ok || cerr != nil {
				t.Fatalf("row 5 committed during the batch: %v, %v; want true, nil", ok, cerr)
			}
			if n := pendingRows(t, d.DB); n != 1 {
				t.Fatalf("%d rows pending after the batch around row 5, want 1 (row 5: committed during the batch, never sent)", n)
			}
			relayOnce(1)
			want = append(want, ev(5).ID)
			assertExactlyOnce(t, readAll(t, k, topic), want)
			if n := pendingRows(t, d.DB); n != 0 {
				t.Fatalf("%d rows pending at the end", n)
			}
			if positions == "" {
				return
			}
			var batches []string
			for _, rec := range readAll(t, k, positions) {
				var p outbox.Position
				if err := json.Unmarshal(rec.Value, &p); err != nil {
					t.Fatalf("position %q: %v", rec.Value, err)
				}
				if p.Kind == "batch" {
					batches = append(batches, fmt.Sprint(p.IDs))
				}
			}
			if got, want := fmt.Sprint(batches), "[[[1 4] [6 9]] [[5 5]]]"; got != want {
				t.Fatalf("batch positions cover %s, want %s", got, want)
			}
		})
	}
}

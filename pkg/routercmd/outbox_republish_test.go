package routercmd

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// TestOutboxRepublishCommand checks that `router outbox republish --dry-run` counts the
// retained published events of a topic and sends nothing. Without --dry-run it sends them
// with their event ids. Bad input exits with code 2 before anything is sent. Such input is
// a missing flag, a bad time or a topic that Kafka does not have.
func TestOutboxRepublishCommand(t *testing.T) {
	d := testenv.DB(t, 4)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "republish-cli", 2)
	w, err := outbox.NewWriter("")
	if err != nil {
		t.Fatal(err)
	}
	w = w.WithDialect(testenv.Dialect())
	ctx := context.Background()
	var ids []string
	err = dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		for i := range 50 {
			id := fmt.Sprintf("ev-%02d", i)
			ids = append(ids, id)
			if err := w.Add(ctx, tx, outbox.Event{ID: id, Type: "T", Topic: topic, Key: fmt.Sprintf("k%d", i%5), Payload: []byte(id)}); err != nil {
				return err
			}
		}
		return w.Add(ctx, tx, outbox.Event{ID: "pending", Type: "T", Topic: topic, Key: "k0", Payload: []byte("p")})
	})
	if err != nil {
		t.Fatal(err)
	}
	// The relay published them all but the last.
	if _, err := d.DB.Exec(testenv.Rebind("UPDATE outbox SET published_at = ? WHERE event_id <> 'pending'"), time.Now().UTC().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	brokers := strings.Join(k.Brokers, ",")
	run := func(args ...string) (string, error) {
		return capture(t, append([]string{"--dsn", d.DSN, "--brokers", brokers, "outbox", "republish"}, args...)...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no topic", []string{"--since", "1h"}, "--topic is required"},
		{"no since", []string{"--topic", topic}, "--since is required"},
		{"bad since", []string{"--topic", topic, "--since", "yesterday"}, "--since"},
		{"until before since", []string{"--topic", topic, "--since", "1h", "--until", "2h"}, "not after --since"},
		{"bad topic", []string{"--topic", "a b", "--since", "1h"}, "not a topic name"},
		{"missing topic", []string{"--topic", topic + "-missing", "--since", "1h"}, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(tc.args...)
			if ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: %v (exit %d), want exit 2 saying %q\n%s", tc.args, err, ExitCode(err), tc.want, out)
			}
		})
	}
	out, err := run("--topic", topic, "--since", "1h", "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, out, "50 published events of topic "+topic+" chosen", "1 events of topic "+topic+" are not published yet", "every consumer", "dry run: nothing sent")
	if recs, err := k.ReadAll(ctx, topic, time.Second); err != nil || len(recs) != 0 {
		t.Fatalf("the dry run sent %d records (%v)", len(recs), err)
	}
	out, err = run("--topic", topic, "--since", "1h", "--batch-size", "20")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mustContain(t, out, "republished 50 events to topic "+topic+" in 3 Kafka transactions")
	recs, err := k.ReadAll(ctx, topic, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range recs {
		got[r.Headers[outbox.HeaderEventID]]++
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("event %s on the topic %d times, want once", id, got[id])
		}
	}
	if len(recs) != len(ids) {
		t.Errorf("%d records on the topic, want %d", len(recs), len(ids))
	}
}

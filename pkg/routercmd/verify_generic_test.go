package routercmd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

// TestVerifyPluginWithoutInvariants checks that verify names a plugin that declares no
// invariants of its own and runs the generic checks for it. A clean database passes. An
// inbox row of its biz type left processing, as a stalled delivery leaves it, fails verify,
// which names it. So does an outbox row unpublished past relay.lag_bound. Removing each
// fault makes verify pass again. The generic checks are all that verify checks for such a
// plugin.
func TestVerifyPluginWithoutInvariants(t *testing.T) {
	d := testenv.DB(t, 4)
	ctx := context.Background()
	plain := inbox.Plugin{Name: "plain", Topics: []string{"plain-in"}, ConsumerGroup: "plain", BizType: "plain",
		Build: func(context.Context, inbox.PluginEnv) (inbox.Handler, error) {
			return nil, errors.New("not run by verify")
		}}
	reg := []inbox.Plugin{plain}
	verify := func(args ...string) (string, int) {
		t.Helper()
		out, err := cli(t, reg, append([]string{"--dsn", d.DSN, "verify"}, args...)...)
		t.Logf("verify %s: %v\n%s", strings.Join(args, " "), err, out)
		return out, routercmd.ExitCode(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := d.DB.ExecContext(ctx, testenv.Rebind(q), args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	const note = "NOTE plugin plain declares no invariants (inbox.Plugin.Verify): only the generic checks ran for it"

	for _, args := range [][]string{nil, {"--plugins", "plain"}} {
		out, code := verify(args...)
		if code != 0 || !strings.Contains(out, note) || !strings.Contains(out, "processing_rows=0 unpublished_events=0") {
			t.Fatalf("verify %v of a clean database: exit %d, want 0 with the note and the generic counts:\n%s", args, code, out)
		}
	}

	exec(`INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, expire_at)
 VALUES ('k-stuck', 'plain', 'processing', 'u-stuck', 'plain-in', 0, 3, ?, ?, ?)`, []byte("{}"), strings.Repeat("0", 64), time.Now().Add(time.Hour).UTC())
	out, code := verify()
	if code != 1 || !strings.Contains(out, "VIOLATION inbox: 1 rows of biz type plain still processing") || !strings.Contains(out, note) {
		t.Fatalf("verify with a row left processing: exit %d, want 1 naming the row's biz type:\n%s", code, out)
	}
	exec(`DELETE FROM inbox WHERE dedup_key = 'k-stuck'`)

	exec(`INSERT INTO outbox (event_id, event_type, topic, msg_key, payload, created_at) VALUES ('00000000-0000-0000-0000-0000000000aa', 'Plain', 'plain-out', 'k-1', ?, ?)`,
		[]byte("{}"), time.Now().Add(-2*time.Hour).UTC())
	out, code = verify()
	if code != 1 || !strings.Contains(out, "VIOLATION outbox: 1 rows unpublished for longer than relay.lag_bound") {
		t.Fatalf("verify with an outbox row unpublished for 2h: exit %d, want 1 naming it:\n%s", code, out)
	}
	exec(`DELETE FROM outbox WHERE msg_key = 'k-1'`)
	if out, code := verify(); code != 0 {
		t.Fatalf("verify once the faults are gone: exit %d, want 0:\n%s", code, out)
	}
}

package routercmd

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
)

// capture runs the command in-process and returns its stdout.
func capture(t *testing.T, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	runErr := Run(context.Background(), args)
	w.Close()
	os.Stdout = old
	return <-done, runErr
}

// failingGranter fails every step while broken is set.
type failingGranter struct {
	*coupon.Granter
	broken *atomic.Bool
}

func (f failingGranter) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if f.broken.Load() {
		return inbox.Continue, errors.New("wallet service down")
	}
	return f.Granter.Handle(ctx, tx, d)
}

// quarantinedDB is a database with one poison message and one coupon order, o-cli,
// quarantined during an outage.
func quarantinedDB(t *testing.T) testenv.Database {
	t.Helper()
	d := testenv.DB(t, 4, registeredMigrations()...)
	ctx := context.Background()
	cfg := coupon.DefaultConfig() // what the router's plugin builds with no config file
	if err := coupon.EnsureCampaign(ctx, d.DB, cfg); err != nil {
		t.Fatal(err)
	}
	g, err := coupon.NewGranter(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	broken.Store(true)
	ib, err := engine.New(d.DB, failingGranter{g, &broken}, engine.Config{BizType: coupon.BizType, MaxAttempts: 1, DelayedRetries: -1}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := coupon.OrderPaid{OrderID: "o-cli", UserID: "u1", AmountCents: 990, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
	if r, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "order-paid", Partition: 1, Offset: 5}, engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeQuarantined {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte("{oops")), inbox.Source{Topic: "order-paid", Partition: 1, Offset: 6}, engine.ProcessOptions{}); err != nil || r.Reason != engine.ReasonPoison {
		t.Fatalf("%+v %v", r, err)
	}
	return d
}

func dbCount(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func mustContain(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// TestReplayCommand follows the operator's recovery from the binary alone. The operator
// lists what failed, looks at it, dry-runs the replay and replays. A second replay finds
// nothing left, and done rows come back as duplicates.
func TestReplayCommand(t *testing.T) {
	d := quarantinedDB(t)
	db := d.DB
	dsn := []string{"--dsn", d.DSN}
	cli := func(args ...string) string {
		t.Helper()
		out, err := capture(t, append(dsn, args...)...)
		if err != nil {
			t.Fatalf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("router %s\n%s", strings.Join(args, " "), out)
		return out
	}

	out := cli("inbox", "ls", "--status", "failed")
	mustContain(t, out, "o-cli", "retries_exhausted", "wallet service down", "poison:order-paid/1/6", "2 rows")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(cli("inbox", "ls", "--output", "json", "--order-id", "o-cli")), &rows); err != nil || len(rows) != 1 || rows[0]["status"] != "failed" {
		t.Fatalf("ls --output json: %v %v", rows, err)
	}
	out = cli("inbox", "show", "o-cli")
	mustContain(t, out, `"orderId":"o-cli"`, "last_error:", "wallet service down", "partition=1 offset=5")

	out = cli("replay", "--biz-type", "coupon", "--dry-run")
	mustContain(t, out, "would run again", "would be quarantined again (poison", "dry run: nothing was changed",
		"REPLAY id=1 biz_type=coupon dry_run=true selected=2 processed=0")
	if n := dbCount(t, db, "SELECT COUNT(*) FROM user_coupon"); n != 0 {
		t.Fatalf("dry run granted %d coupons", n)
	}

	out = cli("replay", "--biz-type", "coupon", "--rate", "50")
	mustContain(t, out, "REPLAY id=2 biz_type=coupon dry_run=false selected=2 processed=1 duplicates=0 quarantined=1 conflicts=0 refused=0 outcome=partial",
		"1 poison rows cannot be decoded: replaying them quarantines them again")
	if n := dbCount(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = 'o-cli'"); n != 1 {
		t.Fatalf("coupons after replay = %d, want 1", n)
	}
	if n := dbCount(t, db, "SELECT COUNT(*) FROM inbox WHERE dedup_key = 'o-cli' AND status = 'done' AND replay_id = 2"); n != 1 {
		t.Fatal("row not done with replay id 2")
	}
	if n := dbCount(t, db, "SELECT COUNT(*) FROM replay WHERE id = 2 AND selected = 2 AND processed = 1 AND quarantined = 1 AND outcome = 'partial' AND finished_at IS NOT NULL"); n != 1 {
		t.Fatal("replay 2 not recorded")
	}

	// Done rows come back as duplicates, nothing is granted, and the output says so. The
	// biz type is inferred.
	out = cli("replay", "--status", "done", "--output", "json")
	var rep struct {
		Replay inboxops.ReplayReport `json:"replay"`
		Rows   []replayRowJSON       `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Replay.Duplicates != 1 || rep.Replay.Processed != 0 || len(rep.Rows) != 1 || rep.Rows[0].Outcome != "duplicate" {
		t.Fatalf("replay --status done --output json: %+v %v\n%s", rep, err, out)
	}
	out = cli("inbox", "retry", "o-cli")
	mustContain(t, out, "duplicate (already done: no change)", "already done: they came back as duplicates and nothing changed", "duplicates=1")
	if n := dbCount(t, db, "SELECT COUNT(*) FROM user_coupon"); n != 1 {
		t.Fatalf("coupons = %d, want 1", n)
	}
	out = cli("inbox", "ls", "--replay-id", "2")
	mustContain(t, out, "o-cli", "poison:order-paid/1/6", "2 rows")

	// By reason, the poison row is still failed and no row of retries_exhausted is.
	out = cli("replay", "--biz-type", "coupon", "--reason", "retries_exhausted", "--dry-run")
	mustContain(t, out, "dry_run=true selected=0")
	out = cli("replay", "--biz-type", "coupon", "--reason", "poison", "--dry-run")
	mustContain(t, out, "would be quarantined again (poison", "dry_run=true selected=1")
	out = cli("inbox", "ls", "--status", "failed", "--reason", "poison")
	mustContain(t, out, "poison:order-paid/1/6", "1 rows")
}

// TestReplayBadInput checks that bad input to replay and inbox gets one line and exit code
// 2, and changes nothing.
func TestReplayBadInput(t *testing.T) {
	d := quarantinedDB(t)
	state := func() string {
		var b strings.Builder
		for _, q := range []string{"SELECT COUNT(*) FROM replay", "SELECT COUNT(*) FROM user_coupon",
			"SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND replay_id IS NULL", "SELECT COALESCE(SUM(duplicates), 0) FROM inbox"} {
			fmt.Fprintf(&b, "%d ", dbCount(t, d.DB, q))
		}
		return b.String()
	}
	before := state()
	dsn := []string{"--dsn", d.DSN}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown biz type", []string{"replay", "--biz-type", "nope"}, []string{"unknown biz type", "nope", "coupon"}},
		{"unknown biz type ls", []string{"inbox", "ls", "--biz-type", "nope"}, []string{"unknown biz type"}},
		{"invalid older-than", []string{"replay", "--older-than", "soon"}, []string{"invalid argument", "soon", "--older-than"}},
		{"invalid since", []string{"replay", "--since", "yesterday"}, []string{"--since", "yesterday", "RFC3339"}},
		{"invalid until", []string{"inbox", "ls", "--until", "2026-13-01T00:00:00Z"}, []string{"--until"}},
		{"since after until", []string{"replay", "--since", "1h", "--until", "2h"}, []string{"since", "not before until"}},
		{"bad status", []string{"replay", "--status", "stuck"}, []string{"--status", "stuck"}},
		{"bad reason", []string{"replay", "--reason", "outage"}, []string{"--reason", "outage"}},
		{"processing without older-than", []string{"replay", "--status", "processing"}, []string{"needs --older-than"}},
		{"negative rate", []string{"replay", "--rate", "-1"}, []string{"--rate"}},
		{"bad rate", []string{"inbox", "retry", "--rate", "fast"}, []string{"invalid argument", "fast"}},
		{"negative limit", []string{"inbox", "retry", "--limit", "-3"}, []string{"limit"}},
		{"bad output", []string{"inbox", "ls", "--output", "xml"}, []string{"--output", "xml"}},
		{"unknown flag", []string{"replay", "--frobnicate"}, []string{"unknown flag", "--frobnicate"}},
		{"show without ref", []string{"inbox", "show"}, []string{"accepts 1 arg"}},
		{"biz type not inferable", []string{"replay", "--status", "done"}, []string{"--biz-type is required"}},
		{"bad dsn", []string{"--dsn", "not a dsn", "replay"}, []string{"db.dsn"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := capture(t, append(append([]string(nil), dsn...), tc.args...)...)
			if err == nil {
				t.Fatalf("expected an error; output:\n%s", out)
			}
			if got := ExitCode(err); got != 2 {
				t.Errorf("exit code %d, want 2 (%v)", got, err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if after := state(); after != before {
		t.Fatalf("bad input changed the database: %s -> %s", before, after)
	}
}

// TestReplayJSONListsEveryRow checks that `replay --output json` writes each row as it is
// replayed. The output is one line that holds every selected row in id order and the
// replay's report after them. It is valid JSON also when nothing matched.
func TestReplayJSONListsEveryRow(t *testing.T) {
	d := quarantinedDB(t)
	out, err := capture(t, "--dsn", d.DSN, "replay", "--biz-type", "coupon", "--dry-run", "--output", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep struct {
		Replay inboxops.ReplayReport `json:"replay"`
		Rows   []replayRowJSON       `json:"rows"`
	}
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, `{"rows":[{`) {
		t.Fatalf("not one line of rows then the report:\n%s", out)
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Replay.Selected != 2 || !rep.Replay.DryRun || len(rep.Rows) != 2 ||
		rep.Rows[0].DedupKey != "o-cli" || rep.Rows[0].Result != "would run again" || rep.Rows[1].ID <= rep.Rows[0].ID ||
		!strings.HasPrefix(rep.Rows[1].Result, "would be quarantined again") {
		t.Fatalf("%+v %v\n%s", rep, err, out)
	}
	out, err = capture(t, "--dsn", d.DSN, "replay", "--biz-type", "coupon", "--order-id", "no-such-order", "--output", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rep.Rows = nil
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Replay.Selected != 0 || rep.Rows == nil || len(rep.Rows) != 0 {
		t.Fatalf("nothing matched: %+v %v\n%s", rep, err, out)
	}
}

// TestReplayRefusesCutRows checks rows that hold less than the delivered message. One has
// headers over inbox.max_metadata_bytes, and one has a value over inbox.max_payload_bytes.
// Both were quarantined through the real inbox. `router replay` refuses them with the
// reason, in a dry run and a real one, and so does `router inbox retry`. Nothing runs, and
// the rows stay as they were. A later delivery of a quarantined key shows as held in
// `inbox ls` and `inbox show`.
func TestReplayRefusesCutRows(t *testing.T) {
	d := quarantinedDB(t) // o-cli failed with retries exhausted, and a poison row
	db := d.DB
	ctx := context.Background()
	g, err := coupon.NewGranter(coupon.DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := engine.New(db, g, engine.Config{BizType: coupon.BizType}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	order := func(id string) *message.Message {
		o := coupon.OrderPaid{OrderID: id, UserID: "u1", AmountCents: 990, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
		return message.NewMessage(watermill.NewUUID(), o.Encode())
	}
	headers := order("o-headers")
	for i := range 70 {
		headers.Metadata.Set(fmt.Sprintf("h%02d", i), strings.Repeat("v", 600))
	}
	big := order("o-big")
	big.Payload = append(big.Payload, strings.Repeat(" ", 2<<20)...) // the order, then padding, so its prefix decodes
	ids := map[string]int64{}
	for name, m := range map[string]*message.Message{"headers": headers, "value": big} {
		r, err := ib.Process(ctx, m, inbox.Source{Topic: "order-paid", Partition: 2, Offset: int64(len(ids))}, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonPoison {
			t.Fatalf("%s: %+v %v", name, r, err)
		}
		ids[name] = r.InboxID
	}
	// o-cli's cause is fixed by now, but it stays quarantined, so a new delivery is held.
	if r, err := ib.Process(ctx, order("o-cli"), inbox.Source{Topic: "order-paid", Partition: 1, Offset: 9}, engine.ProcessOptions{}); err != nil || r.Outcome != engine.OutcomeHeld {
		t.Fatalf("redelivery of o-cli: %+v %v, want held", r, err)
	}
	state := func() string {
		var b strings.Builder
		for _, q := range []string{"SELECT COUNT(*) FROM user_coupon", "SELECT COUNT(*) FROM replay_row",
			"SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND replay_id IS NULL AND attempts = 0 AND dedup_key LIKE 'poison:order-paid/2/%'"} {
			fmt.Fprintf(&b, "%d ", dbCount(t, db, q))
		}
		return b.String()
	}
	before := state()
	dsn := []string{"--dsn", d.DSN}
	cli := func(args ...string) string {
		t.Helper()
		out, err := capture(t, append(dsn, args...)...)
		if err != nil {
			t.Fatalf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("router %s\n%s", strings.Join(args, " "), out)
		return out
	}
	refusals := []string{"refused, left quarantined: not replayable: its headers are stored cut to inbox.max_metadata_bytes",
		fmt.Sprintf("refused, left quarantined: not replayable: only a 65536-byte prefix of its %d-byte value is stored", len(big.Payload))}
	byKey := []string{"--order-id", fmt.Sprintf("poison:order-paid/2/%d", 0), "--order-id", fmt.Sprintf("poison:order-paid/2/%d", 1)}
	out := cli(append([]string{"replay", "--biz-type", "coupon", "--dry-run"}, byKey...)...)
	mustContain(t, out, append(refusals, "2 rows hold less than the delivered message", "selected=2 processed=0 duplicates=0 quarantined=0 conflicts=0 refused=2 outcome=dry_run")...)
	out = cli(append([]string{"replay", "--biz-type", "coupon"}, byKey...)...)
	mustContain(t, out, append(refusals, "selected=2 processed=0 duplicates=0 quarantined=0 conflicts=0 refused=2 outcome=partial")...)
	out = cli("inbox", "retry", "--biz-type", "coupon", fmt.Sprint(ids["headers"]), fmt.Sprint(ids["value"]))
	mustContain(t, out, append(refusals, "refused=2 outcome=partial")...)
	if after := state(); after != before {
		t.Fatalf("the refused replays changed the database: %s, want %s", after, before)
	}
	out = cli("inbox", "show", fmt.Sprint(ids["headers"]))
	mustContain(t, out, "replayable:   no, a replay refuses it: not replayable: its headers are stored cut")
	out = cli("inbox", "show", "o-cli")
	mustContain(t, out, "held:", "1 later deliveries, not run (a replay or `router inbox resolve` releases the key)", "replayable:   yes")
	var rows []rowJSON
	if err := json.Unmarshal([]byte(cli("inbox", "ls", "--status", "failed", "--output", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		switch {
		case r.DedupKey == "o-cli" && (r.Held != 1 || r.NotReplayable != ""):
			t.Errorf("o-cli in ls --output json: held %d, not_replayable %q; want 1 held, replayable", r.Held, r.NotReplayable)
		case r.ID == ids["value"] && !strings.Contains(r.NotReplayable, "prefix"):
			t.Errorf("the cut value's row in ls --output json: not_replayable %q", r.NotReplayable)
		}
	}
}

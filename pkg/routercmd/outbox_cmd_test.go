package routercmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
)

// parkedDB is a database with two parked events as the relay leaves them. One has an event
// held behind it. They have a key and an error with control characters, and a payload that
// is not UTF-8.
func parkedDB(t *testing.T) testenv.Database {
	t.Helper()
	d := testenv.DB(t, 4, registeredMigrations()...) // verify reads the plugins' tables too
	ins := testenv.Dialect().Rebind(`INSERT INTO outbox_parked (id, event_id, event_type, topic, msg_key, payload, headers, created_at, reason, error, held_behind)
 VALUES (?, ?, 'T', ?, ?, ?, ?, CURRENT_TIMESTAMP(6), ?, ?, ?)`)
	rows := [][]any{
		{10, "ev-head", "t-missing", "k\x1b[2J", []byte(`{"n":1}`), `{"trace":"x\u202ey"}`, "unknown_topic",
			"kafka refuses event ev-head for topic t-missing (key \"k\\x1b[2J\"): topic t-missing does not exist\nafter a refresh", nil},
		{12, "ev-held", "t-good", "k\x1b[2J", []byte(`{"n":2}`), nil, "held", "held: waits behind parked event ev-head", "ev-head"},
		{20, "ev-big", "t-good", "other", append(bytes.Repeat([]byte("y"), 100), 0xff, 0xfe), nil, "too_large",
			"kafka refuses event ev-big: record of 2000000 bytes is larger than the producer's Producer.MaxMessageBytes", nil},
	}
	for _, r := range rows {
		if _, err := d.DB.Exec(ins, r...); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestOutboxCommands handles parked outbox events from the binary as an operator does. It
// lists them and looks at one. What cannot be done is refused with exit code 2 and changes
// nothing. It retries one event with its held follower and drops one.
func TestOutboxCommands(t *testing.T) {
	d := parkedDB(t)
	dsn := []string{"--dsn", d.DSN}
	cli := func(args ...string) string {
		t.Helper()
		out, err := capture(t, append(dsn, args...)...)
		if err != nil {
			t.Fatalf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("router %s\n%s", strings.Join(args, " "), out)
		if strings.ContainsAny(out, "\x1b\u202e") {
			t.Errorf("router %s printed a control or format character: %q", strings.Join(args, " "), out)
		}
		return out
	}
	out := cli("outbox", "ls")
	mustContain(t, out, "ev-head", "t-missing", `k\x1b[2J`, "unknown_topic", "kafka refuses event ev-head for topic t-missing", "ev-held", "held", "ev-big",
		"too_large", "3 parked events (2 refused, 1 held)", "router outbox retry")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(cli("outbox", "ls", "--output", "json", "--limit", "2")), &rows); err != nil || len(rows) != 2 ||
		rows[0]["event_id"] != "ev-head" || rows[0]["holding"] != 1.0 || rows[1]["held_behind"] != "ev-head" || rows[0]["key"] != "k\x1b[2J" {
		t.Fatalf("ls --output json --limit 2: %v %v", rows, err)
	}
	out = cli("outbox", "show", "ev-head")
	mustContain(t, out, "event_id:    ev-head", `key:         k\x1b[2J`, `does not exist\nafter a refresh`, "1 events held behind it",
		`trace=x\u202ey`, `(7 bytes) {"n":1}`)
	out = cli("outbox", "show", "20", "--max-bytes", "10") // by outbox id
	mustContain(t, out, "ev-big", "(102 bytes, first 10 shown (--max-bytes)) yyyyyyyyyy")
	out = cli("outbox", "show", "ev-big")
	mustContain(t, out, "not UTF-8, base64")
	var shown map[string]any
	if err := json.Unmarshal([]byte(cli("outbox", "show", "ev-held", "--output", "json")), &shown); err != nil || shown["payload"] != `{"n":2}` {
		t.Fatalf("show --output json: %v %v", shown, err)
	}

	state := func() string {
		return strings.Join([]string{
			strings.Repeat("p", dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox_parked")),
			strings.Repeat("o", dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox")),
		}, "/")
	}
	before := state()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown id", []string{"outbox", "retry", "99999"}, []string{"no parked event", "99999"}},
		{"unknown event id", []string{"outbox", "drop", "no-such-event", "--yes"}, []string{"no parked event", "no-such-event"}},
		{"held event", []string{"outbox", "retry", "ev-held"}, []string{"waits behind ev-head"}},
		{"drop held event", []string{"outbox", "drop", "12", "--yes"}, []string{"waits behind ev-head"}},
		{"control characters", []string{"outbox", "show", "ev\x1b[2J"}, []string{`ev\x1b[2J`, "neither an outbox id nor an event id"}},
		{"too long", []string{"outbox", "retry", strings.Repeat("x", 37)}, []string{"neither an outbox id nor an event id"}},
		{"empty", []string{"outbox", "show", ""}, []string{"neither an outbox id nor an event id"}},
		{"drop without --yes", []string{"outbox", "drop", "ev-big"}, []string{"ev-big", "for good", "--yes"}},
		{"bad output", []string{"outbox", "ls", "--output", "xml"}, []string{"--output", "xml"}},
		{"negative limit", []string{"outbox", "ls", "--limit", "-1"}, []string{"--limit"}},
		{"no id", []string{"outbox", "retry"}, []string{"name an event", "--all"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := capture(t, append(append([]string(nil), dsn...), tc.args...)...)
			if err == nil {
				t.Fatalf("expected an error; output:\n%s", out)
			}
			if got := ExitCode(err); got != 2 {
				t.Errorf("exit code %d, want 2 (%v)", got, err)
			}
			if strings.ContainsAny(err.Error(), "\n\x1b") {
				t.Errorf("error is not one safe line: %q", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if after := state(); after != before {
		t.Fatalf("bad input changed the tables: %s -> %s", before, after)
	}

	// verify reports parked rows, though not as a violation, and so do the metrics.
	out = cli("verify")
	mustContain(t, out, "outbox_parked=3", "PARKED 3 outbox events are not published: Kafka refuses 2 of them for good, 1 wait behind those")
	if strings.Contains(out, "VIOLATION") {
		t.Errorf("verify reports parked events as a violation:\n%s", out)
	}
	got := map[string]float64{}
	families, err := metrics.New(d.DB).Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "onceflow_outbox_parked_rows" {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if got["false"] != 2 || got["true"] != 1 {
		t.Errorf("onceflow_outbox_parked_rows = %v, want held=false 2, held=true 1", got)
	}

	out = cli("outbox", "retry", "ev-head")
	mustContain(t, out, "retried event ev-head", "2 events back in the outbox (it and 1 held behind it)")
	if n := dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox WHERE id IN (10, 12) AND published_at IS NULL"); n != 2 {
		t.Fatalf("%d of the retried events are back in the outbox with their ids, want 2", n)
	}
	out = cli("outbox", "drop", "ev-big", "--yes")
	mustContain(t, out, "dropped event ev-big", "0 events held behind it are back in the outbox")
	out = cli("outbox", "ls")
	mustContain(t, out, "0 parked events (0 refused, 0 held)")
	if n := dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox WHERE event_id = 'ev-big'"); n != 0 {
		t.Fatal("the dropped event is in the outbox")
	}
}

// TestOutboxSelections checks that retry and drop choose several refused events with --all,
// --topic or --reason. They print the count and the events first. --dry-run changes
// nothing, and nor does drop without --yes. Then each event is released with the events
// held behind it.
func TestOutboxSelections(t *testing.T) {
	d := parkedDB(t)
	run := func(args ...string) (string, error) {
		t.Helper()
		return capture(t, append([]string{"--dsn", d.DSN, "outbox"}, args...)...)
	}
	state := func() string {
		return fmt.Sprintf("parked %d, outbox %d", dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox_parked"), dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox"))
	}
	before := state()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"an event and a selection", []string{"retry", "ev-head", "--all"}, "not both"},
		{"all and a topic", []string{"drop", "--all", "--topic", "t-good", "--yes"}, "leave out --topic"},
		{"held is no refusal", []string{"retry", "--reason", "held"}, "one of unknown_topic, too_large"},
		{"unknown reason", []string{"retry", "--reason", "nope"}, "one of unknown_topic"},
		{"dry run of one event", []string{"retry", "ev-head", "--dry-run"}, "--dry-run goes with"},
		{"bad topic", []string{"retry", "--topic", "t\x1b"}, "not a topic name"},
		{"drop without --yes", []string{"drop", "--reason", "too_large"}, "drop deletes these 1 events for good"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(tc.args...)
			if ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: %v (exit %d), want exit 2 saying %q\n%s", tc.args, err, ExitCode(err), tc.want, out)
			}
		})
	}
	out, err := run("retry", "--topic", "t-missing", "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, out, "1 refused parked events chosen (topic t-missing), 1 events held behind them", "ev-head", "dry run: nothing done")
	out, _ = run("drop", "--all", "--dry-run")
	mustContain(t, out, "2 refused parked events chosen (all), 1 events held behind them", "ev-head", "ev-big")
	if after := state(); after != before {
		t.Fatalf("dry runs and bad input changed the tables: %s -> %s", before, after)
	}
	out, err = run("retry", "--reason", "unknown_topic")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, out, "1 refused parked events chosen (reason unknown_topic)", "retried 1 events: 2 events back in the outbox")
	if n := dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox WHERE id IN (10, 12)"); n != 2 {
		t.Fatalf("%d of the retried events are back in the outbox, want 2", n)
	}
	out, err = run("drop", "--all", "--yes")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, out, "1 refused parked events chosen (all)", "ev-big", "dropped 1 events")
	out, _ = run("retry", "--all")
	mustContain(t, out, "0 refused parked events chosen (all)")
	if got := state(); got != "parked 0, outbox 2" {
		t.Fatalf("after retry and drop: %s, want parked 0, outbox 2", got)
	}
}

// TestOutboxSelectionListsTheFirst checks that a selection of many refused events lists the
// first of them, not every one, and then releases them all.
func TestOutboxSelectionListsTheFirst(t *testing.T) {
	d := parkedDB(t)
	ins := testenv.Dialect().Rebind(`INSERT INTO outbox_parked (id, event_id, event_type, topic, msg_key, payload, created_at, reason, error)
 VALUES (?, ?, 'T', 't-many', ?, ?, CURRENT_TIMESTAMP(6), 'unknown_topic', 'topic t-many does not exist')`)
	for i := range 30 {
		if _, err := d.DB.Exec(ins, 1000+i, fmt.Sprintf("many-%02d", i), fmt.Sprintf("k%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	out, err := capture(t, "--dsn", d.DSN, "outbox", "retry", "--topic", "t-many", "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, out, "30 refused parked events chosen (topic t-many), 0 events held behind them", "many-00", "many-19", "… and 10 more")
	if strings.Contains(out, "many-20") {
		t.Errorf("the dry run lists more than the first 20:\n%s", out)
	}
	out, err = capture(t, "--dsn", d.DSN, "outbox", "retry", "--topic", "t-many")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, out, "retried 30 events: 30 events back in the outbox")
	if n := dbCount(t, d.DB, "SELECT COUNT(*) FROM outbox WHERE id BETWEEN 1000 AND 1029"); n != 30 {
		t.Fatalf("%d of the 30 retried events are back in the outbox, want 30", n)
	}
}

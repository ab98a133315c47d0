package routercmd

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestCLIEscapesOutsideData checks that outside data reaches the operator's terminal
// escaped. A dedup key, an error text, a header and a payload carry terminal escape
// sequences and a bidirectional override. inbox ls, inbox show and replay print them, in
// tables and in JSON, without one raw control or format character. The JSON still holds the
// exact key.
func TestCLIEscapesOutsideData(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs MariaDB")
	}
	d := testenv.DB(t, 4, registeredMigrations()...)
	const key = "ord\x1b[2J\x1b]0;pwned\x07-\u202eevil"
	if _, err := d.DB.Exec(testenv.Dialect().Rebind(`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, metadata, fingerprint, attempts, last_error, expire_at)
		VALUES (?, 'coupon', 'failed', 'poison', 'm-1', 'order-paid', 0, 7, ?, ?, '', 1, ?, ?)`),
		key, []byte("{\"orderId\":\"\x1b[31mred\"}"), `{"h":"\u001b[2Jx\u202e"}`, "poison: bad \x1b[1mbold\r\nline", time.Now().Add(24*time.Hour).UTC()); err != nil {
		t.Fatal(err)
	}
	dsn := []string{"--dsn", d.DSN}
	for _, args := range [][]string{
		{"inbox", "ls", "--status", "all"},
		{"inbox", "ls", "--status", "all", "--output", "json"},
		{"inbox", "show", "1"},
		{"inbox", "show", "1", "--output", "json"},
		{"replay", "--status", "failed", "--dry-run"},
		{"replay", "--status", "failed", "--dry-run", "--output", "json"},
	} {
		out, err := capture(t, append(dsn, args...)...)
		if err != nil {
			t.Fatalf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("router %s\n%s", strings.Join(args, " "), out)
		if i := strings.IndexFunc(out, func(r rune) bool { return r != '\n' && unsafeRune(r) }); i >= 0 {
			t.Errorf("router %s printed %q raw at byte %d", strings.Join(args, " "), out[i:i+1], i)
		}
		if !strings.Contains(out, "ord") {
			t.Errorf("router %s: the row is missing", strings.Join(args, " "))
		}
	}
	out, _ := capture(t, append(dsn, "inbox", "ls", "--status", "all", "--output", "json")...)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || rows[0]["dedup_key"] != key {
		t.Fatalf("inbox ls --output json does not give back the exact key: %v %v", rows, err)
	}
}

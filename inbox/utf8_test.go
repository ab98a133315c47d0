package inbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestCheckJSONText checks that CheckJSONText refuses what encoding/json would decode as
// U+FFFD, naming the first one's offset. That is bytes that are not UTF-8 and \u escapes
// of lone surrogates. Escapes that decode as sent pass.
func TestCheckJSONText(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		err           string // "" when accepted
	}{
		{"ASCII", `{"orderId":"o-1"}`, ""},
		{"empty", ``, ""},
		{"multi-byte UTF-8", `{"orderId":"ünïcødé-😀"}`, ""},
		{"U+FFFD sent as such", "{\"orderId\":\"o-\uFFFD\"}", ""},
		{"U+FFFD escaped", `{"orderId":"o-\ufffd\uFFFD"}`, ""},
		{"surrogate pair", `{"orderId":"o-\ud83d\ude00"}`, ""},
		{"escaped backslash before u", `{"orderId":"o-\\ud800"}`, ""},
		{"escaped backslash then escape", `{"orderId":"o-\\\u0041"}`, ""},
		{"other escapes", `{"orderId":"o-\u0041\n\t\"\/"}`, ""},
		{"short escape left to the decoder", `{"orderId":"o-\ud8`, ""},
		{"byte 0xff in a string", "{\"orderId\":\"u8-\xff\"}", "payload is not valid UTF-8 at byte 15"},
		{"byte 0xfe in a string", "{\"orderId\":\"u8-\xfe\"}", "payload is not valid UTF-8 at byte 15"},
		{"first byte", "\xff{}", "payload is not valid UTF-8 at byte 0"},
		{"truncated sequence", "{\"orderId\":\"é\xc3\"}", "payload is not valid UTF-8 at byte 14"},
		{"overlong encoding", "{\"orderId\":\"\xc0\xaf\"}", "payload is not valid UTF-8 at byte 12"},
		{"encoded surrogate", "{\"orderId\":\"\xed\xa0\x80\"}", "payload is not valid UTF-8 at byte 12"},
		{"outside strings", "{\"orderId\":\"o\"}\xff", "payload is not valid UTF-8 at byte 15"},
		{"lone high surrogate", `{"orderId":"u8-\ud800"}`, "payload is not valid UTF-8 at byte 15: a \\u escape of a lone surrogate"},
		{"lone low surrogate", `{"orderId":"u8-\uDC00"}`, "at byte 15: a \\u escape of a lone surrogate"},
		{"high then not low", `{"orderId":"u8-\ud800\u0041"}`, "at byte 15: a \\u escape"},
		{"high then high", `{"orderId":"u8-\ud800\ud800"}`, "at byte 15: a \\u escape"},
		{"high at the end", `{"orderId":"u8-\udbff`, "at byte 15: a \\u escape"},
		{"after a pair", `{"orderId":"\ud83d\ude00\ude00"}`, "at byte 24: a \\u escape"},
		{"after escaped backslashes", `{"orderId":"\\\\\udfff"}`, "at byte 16: a \\u escape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := inbox.CheckJSONText([]byte(tc.payload))
			if tc.err == "" {
				if err != nil {
					t.Fatalf("CheckJSONText(%q) = %v, want nil", tc.payload, err)
				}
				return
			}
			if !errors.Is(err, inbox.ErrNotUTF8) || !bytes.Contains([]byte(err.Error()), []byte(tc.err)) {
				t.Fatalf("CheckJSONText(%q) = %v, want ErrNotUTF8 containing %q", tc.payload, err, tc.err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("error %q is not UTF-8", err)
			}
		})
	}
	// This is what the check is for. encoding/json alone makes these pairs one value.
	for _, pair := range [][2]string{
		{"{\"orderId\":\"u8-\xff\"}", "{\"orderId\":\"u8-\xfe\"}"},
		{`{"orderId":"u8-\ud800"}`, `{"orderId":"u8-\udbff"}`},
	} {
		var a, b struct{ OrderID string }
		if json.Unmarshal([]byte(pair[0]), &a) != nil || json.Unmarshal([]byte(pair[1]), &b) != nil || a != b {
			t.Fatalf("encoding/json decodes %q and %q as %+v and %+v: the check above is no longer needed", pair[0], pair[1], a, b)
		}
	}
}

// FuzzCheckJSONText checks that a payload the check accepts decodes with no U+FFFD that
// was not sent as one, literally or as \ufffd. The check never panics, and refuses only
// with ErrNotUTF8.
func FuzzCheckJSONText(f *testing.F) {
	for _, s := range []string{`{"a":"b"}`, `"\ud800"`, `"\ud83d\ude00"`, `"\\ud800"`, "\"\xff\"", `["\ufffd","\uDC00x"]`, `"\ud800\u`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := inbox.CheckJSONText(b)
		if err != nil {
			if !errors.Is(err, inbox.ErrNotUTF8) {
				t.Fatalf("error %v does not wrap ErrNotUTF8", err)
			}
			return
		}
		var v any
		if json.Unmarshal(b, &v) != nil {
			return
		}
		if got, sent := replacements(v), sentReplacements(b); got > sent {
			t.Fatalf("%q decodes with %d U+FFFD, %d sent: encoding/json rewrote it", b, got, sent)
		}
	})
}

// replacements counts U+FFFD in v's strings and object keys.
func replacements(v any) int {
	switch v := v.(type) {
	case string:
		return bytes.Count([]byte(v), []byte("\uFFFD"))
	case []any:
		n := 0
		for _, e := range v {
			n += replacements(e)
		}
		return n
	case map[string]any:
		n := 0
		for k, e := range v {
			n += replacements(k) + replacements(e)
		}
		return n
	}
	return 0
}

// sentReplacements counts U+FFFD in b, literal or escaped. An escaped backslash followed by
// "ufffd" counts too, because an upper bound is enough.
func sentReplacements(b []byte) int {
	return bytes.Count(b, []byte("\uFFFD")) + bytes.Count(bytes.ToLower(b), []byte(`\ufffd`))
}

// TestNULBytes checks that a NUL byte, which no PostgreSQL text column stores, never leaves
// a record unrecorded. A business key holding one is poison on PostgreSQL, while MariaDB
// stores and runs it. A message id, an error text or a fingerprint holding one is stored
// with U+FFFD instead, alike for each delivery, on every database.
func TestNULBytes(t *testing.T) {
	h := newEffects()
	h.misbehave = func(_ context.Context, key string, _ int) error {
		if key == "err" {
			return errors.New("bad\x00byte")
		}
		return nil
	}
	g := newGrouped(t, h, inbox.Config{MaxAttempts: 2}, inbox.BatchConfig{})
	ctx := context.Background()
	pg := testenv.Dialect().IsPostgres()
	key := "nul\x00key"
	for i := range 2 {
		r, err := g.inbox.Process(ctx, message.NewMessage("id\x00"+strconv.Itoa(i), []byte(key)), inbox.Source{Topic: "grouped", Offset: int64(i)}, inbox.ProcessOptions{})
		if err != nil {
			t.Fatalf("key with a NUL, delivery %d: %v", i, err)
		}
		want := inbox.Result{Outcome: inbox.OutcomeProcessed, Key: key}
		if i == 1 {
			want.Outcome = inbox.OutcomeDuplicate
		}
		if pg {
			want = inbox.Result{Outcome: inbox.OutcomeQuarantined, Key: fmt.Sprintf("poison:grouped/0/%d", i), Reason: inbox.ReasonPoison}
		}
		if r.Outcome != want.Outcome || r.Key != want.Key || r.Reason != want.Reason {
			t.Errorf("key with a NUL, delivery %d: %+v, want %+v", i, r, want)
		}
	}
	rs := g.send(t, []string{"err", "fine"})
	if rs[0].Outcome != inbox.OutcomeQuarantined || rs[0].Reason != inbox.ReasonRetriesExhausted || rs[1].Outcome != inbox.OutcomeProcessed {
		t.Fatalf("outcomes %+v, want err quarantined (retries exhausted) and fine processed", rs)
	}
	var lastErr, uuid string
	if err := g.db.DB.QueryRow(testenv.Rebind("SELECT last_error, message_uuid FROM inbox WHERE id = ?"), rs[0].InboxID).Scan(&lastErr, &uuid); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "bad\uFFFDbyte") {
		t.Errorf("last_error %q, want the error text with U+FFFD for its NUL", lastErr)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM inbox WHERE message_uuid = ?", "id\uFFFD0"); n != 1 {
		t.Errorf("%d rows with message id %q, want 1", n, "id\uFFFD0")
	}
}

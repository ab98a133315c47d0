package inbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/onceflow/onceflow/inbox"
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

package msgsource

import (
	"context"
	"strings"
	"testing"
)

// The notes of a poison row hold the Kafka key and the payload id Go-quoted. Bytes that are
// not UTF-8 are written as escapes, never replaced, and read back as they were.
func TestNotes(t *testing.T) {
	for _, c := range []struct {
		key    string
		hasKey bool
		id     string
		want   string
	}{
		{"oc-pz-0093", true, "oc-pz-0093", `kafka key "oc-pz-0093"; payload id "oc-pz-0093"; `},
		{"\xff-pz\x1b", true, "", `kafka key "\xff-pz\x1b"; `},
		{"", true, "", `kafka key ""; `},
		{"", false, "o-1", `payload id "o-1"; `},
		{strings.Repeat("k", 200), true, "", `kafka key of 200 bytes; `},
		{"", false, "", ""},
	} {
		got := Notes(c.key, c.hasKey, c.id)
		if got != c.want {
			t.Errorf("Notes(%q, %v, %q) = %q, want %q", c.key, c.hasKey, c.id, got, c.want)
		}
		text := got + "json: invalid character"
		if k, ok := NotedKey(text); ok != (c.hasKey && len(c.key) <= MaxNoted) || k != map[bool]string{true: c.key}[ok] {
			t.Errorf("NotedKey(%q) = %q, %v", text, k, ok)
		}
		if rest := WithoutNotes(text); rest != "json: invalid character" {
			t.Errorf("WithoutNotes(%q) = %q", text, rest)
		}
	}
	if got := WithoutNotes(`kafka key "unterminated`); got != `kafka key "unterminated` {
		t.Errorf("WithoutNotes of a broken note: %q", got)
	}
}

// Key reads the key that WithKey set, and no key from a context that holds none.
func TestKey(t *testing.T) {
	if _, ok := Key(context.Background()); ok {
		t.Fatal("a key from an empty context")
	}
	if k, ok := Key(WithKey(context.Background(), "\xffk")); !ok || k != "\xffk" {
		t.Fatalf("Key = %q, %v", k, ok)
	}
}

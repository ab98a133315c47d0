package routercmd

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Everything the command line prints that came from outside — keys, payloads, headers,
// error texts, topics — goes through safeText (tables and show pages) or writeJSON (JSON
// output): a key carrying terminal escape sequences is shown, never obeyed.

// unsafeRune reports a rune that must not reach a terminal as it is: control characters
// (which move the cursor, recolour or clear the screen) and format characters (bidirectional
// overrides reorder what follows), line and paragraph separators.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// safeText escapes what unsafeRune names, and bytes that are not UTF-8, as Go escapes
// (\n, \t, \x1b, \u202e, \xff): keys, errors and payloads are printed on one line as
// they are otherwise.
func safeText(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}

// writeJSON prints v as one line of JSON on stdout. encoding/json escapes control
// characters but not format characters (a bidirectional override in a key would reorder
// the rest of the line on a terminal): those are escaped too (\u202e), which is still the
// same JSON string.
func writeJSON(v any) error {
	s, err := safeJSON(v)
	if err != nil {
		return err
	}
	_, err = os.Stdout.WriteString(s + "\n")
	return err
}

// safeJSON is v as JSON with the format characters escaped too (see writeJSON).
func safeJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for _, r := range string(b) {
		if r < 0x80 || !unsafeRune(r) {
			out.WriteRune(r)
			continue
		}
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			fmt.Fprintf(&out, `\u%04x\u%04x`, r1, r2)
		} else {
			fmt.Fprintf(&out, `\u%04x`, r)
		}
	}
	return out.String(), nil
}

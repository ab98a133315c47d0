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

// Everything the command line prints that came from outside goes through safeText or
// writeJSON. That covers keys, payloads, headers, error texts and topics. Tables and show
// pages use safeText, and JSON output uses writeJSON. So a key carrying terminal escape
// sequences is shown, never obeyed.

// unsafeRune reports whether r must not reach a terminal as it is. That holds for control
// characters, which move the cursor, recolour or clear the screen. It holds for format
// characters, since a bidirectional override reorders what follows. It holds for the line
// and paragraph separators too.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// safeText escapes the runes that unsafeRune names, and bytes that are not UTF-8, as Go
// escapes such as \n, \t, \x1b, \u202e and \xff. So keys, errors and payloads print on one
// line, and the rest of their text prints as it is.
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
// characters but not format characters. A bidirectional override in a key would reorder the
// rest of the line on a terminal. So writeJSON escapes format characters too, as in \u202e,
// and the JSON string stays the same.
func writeJSON(v any) error {
	s, err := safeJSON(v)
	if err != nil {
		return err
	}
	_, err = os.Stdout.WriteString(s + "\n")
	return err
}

// safeJSON is v as JSON with the format characters escaped too, as writeJSON explains.
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

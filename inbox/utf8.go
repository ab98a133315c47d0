package inbox

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrNotUTF8 is wrapped by CheckJSONText's error.
var ErrNotUTF8 = errors.New("not valid UTF-8")

// CheckJSONText returns nil when encoding/json decodes b's strings as sent. Otherwise it
// returns an error wrapping ErrNotUTF8 that names the first offending byte, counted from
// 0, such as "payload is not valid UTF-8 at byte 7". A codec returns the error as poison
// before it decodes b.
//
// encoding/json replaces each byte that is not UTF-8, and each \u escape of a lone
// surrogate, with U+FFFD. Two messages that differ only there would decode to one value,
// and one business key. JSON text is UTF-8, as RFC 8259 section 8.1 says. So the whole
// payload is checked, not only its strings.
func CheckJSONText(b []byte) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("payload is %w at byte %d", ErrNotUTF8, firstInvalidUTF8(b))
	}
	if at := loneSurrogate(b); at >= 0 {
		return fmt.Errorf("payload is %w at byte %d: a \\u escape of a lone surrogate", ErrNotUTF8, at)
	}
	return nil
}

// firstInvalidUTF8 is the offset of the first byte of b that starts no valid UTF-8 sequence.
func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// loneSurrogate is the offset of the first \u escape of a surrogate that is not a high
// surrogate followed by a \u escape of a low one. encoding/json decodes such an escape as
// U+FFFD. loneSurrogate returns -1 when there is none. A backslash after an odd number of
// backslashes is itself escaped, so it starts no escape.
func loneSurrogate(b []byte) int {
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(`\u`))
		if j < 0 {
			return -1
		}
		at := i + j
		i = at + 2
		k := at
		for k > 0 && b[k-1] == '\\' {
			k--
		}
		if (at-k)%2 == 1 {
			continue
		}
		r, ok := hex4(b, at+2)
		switch {
		case !ok || r < 0xD800 || r > 0xDFFF:
		case r >= 0xDC00:
			return at
		default:
			if lo, ok := hex4(b, at+8); ok && b[at+6] == '\\' && b[at+7] == 'u' && lo >= 0xDC00 && lo <= 0xDFFF {
				i = at + 12
				continue
			}
			return at
		}
	}
}

// hex4 reads the four hex digits at b[at:].
func hex4(b []byte, at int) (rune, bool) {
	if at < 0 || at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

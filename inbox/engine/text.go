package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Text that reaches the inbox's utf8mb4 columns is made storable first. A record's bytes
// come from outside, and a plugin's error text may quote them. So nothing is assumed.

// maxErrorBytes bounds last_error. A TEXT column holds 65,535 bytes, and a panic's stack
// is the longest text it gets.
const maxErrorBytes = 16 << 10

// maxUUIDBytes is the width of message_uuid.
const maxUUIDBytes = 64

// MetadataTruncatedKey is the metadata entry that replaces the entries left out when a
// record's metadata exceeded inbox.max_metadata_bytes. It says how much was dropped, and
// gives the sha256 of the whole encoded metadata.
const MetadataTruncatedKey = "onceflow_metadata_truncated"

// validText returns s as valid UTF-8 of at most max bytes, cut on a character boundary.
// Each invalid byte sequence, and each NUL, is replaced by U+FFFD.
func validText(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD") // no text column of PostgreSQL stores a NUL
	}
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// errorText is the stored form of an error.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return validText(err.Error(), maxErrorBytes)
}

// metadataJSON encodes a message's metadata for the metadata column. encoding/json writes
// valid UTF-8 whatever the strings hold. The second result is false when the encoding is
// longer than max bytes. The returned JSON then keeps the entries that fit, smallest
// first, and MetadataTruncatedKey.
func metadataJSON(md message.Metadata, max int) (string, bool) {
	if len(md) == 0 && max >= len("null") {
		// What json.Marshal writes for no metadata, without its allocations.
		if md == nil {
			return "null", true
		}
		return "{}", true
	}
	b, _ := json.Marshal(md)
	if len(b) <= max {
		return string(b), true
	}
	sum := sha256.Sum256(b)
	note := fmt.Sprintf("%d bytes of metadata in %d entries exceeded the %d-byte limit; sha256 %s", len(b), len(md), max, hex.EncodeToString(sum[:]))
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if a, b := len(keys[i])+len(md[keys[i]]), len(keys[j])+len(md[keys[j]]); a != b {
			return a < b
		}
		return keys[i] < keys[j]
	})
	kept := map[string]string{MetadataTruncatedKey: note}
	size := len(note) + len(MetadataTruncatedKey) + 64
	for _, k := range keys {
		// Escaping as \u00XX can grow a string up to six-fold. The final check below keeps
		// the bound exact.
		n := 6*(len(k)+len(md[k])) + 6
		if size+n > max {
			break
		}
		kept[k] = md[k]
		size += n
	}
	out, _ := json.Marshal(kept)
	if len(out) > max {
		out, _ = json.Marshal(map[string]string{MetadataTruncatedKey: note})
	}
	return string(out), false
}

// messageUUID is the stored form of a message's id, in a column of 64 characters. A
// message without one gets a new id.
func messageUUID(msg *message.Message) string {
	if msg.UUID == "" {
		msg.UUID = watermill.NewUUID()
	}
	return validText(msg.UUID, maxUUIDBytes)
}

// storableFingerprint returns a plugin's fingerprint as stored. It stays as given when it
// is valid UTF-8 of at most 64 bytes, the column's width, without a NUL. Otherwise it is
// stored as its sha256 in hex.
func storableFingerprint(fp string) string {
	if len(fp) <= 64 && utf8.ValidString(fp) && strings.IndexByte(fp, 0) < 0 {
		return fp
	}
	return fingerprint([]byte(fp))
}

// storedFingerprint is a fingerprint as read back from its CHAR(64) column, without the
// padding PostgreSQL returns. MariaDB strips the padding itself.
func storedFingerprint(fp string) string { return strings.TrimRight(fp, " ") }

// storedFingerprintOf is storedFingerprint of a column read in place. It returns want
// itself when they are equal, so it makes no copy.
func storedFingerprintOf(fp []byte, want string) string {
	fp = bytes.TrimRight(fp, " ")
	if string(fp) == want {
		return want
	}
	return string(fp)
}

// statusOf is a status column read in place. It returns the constant for a known status,
// so it makes no copy.
func statusOf(b []byte) Status {
	for _, s := range [...]Status{StatusDone, StatusProcessing, StatusFailed} {
		if string(b) == string(s) {
			return s
		}
	}
	return Status(b)
}

// shortFingerprint is a 16-character tag of a fingerprint for the key of a conflict row.
// It is the first 16 characters of a sha256 hex fingerprint, else of the fingerprint's own
// sha256.
func shortFingerprint(fp string) string {
	if len(fp) == 64 && isHex(fp) {
		return fp[:16]
	}
	return fingerprint([]byte(fp))[:16]
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

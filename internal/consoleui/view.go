// Package consoleui renders the operator console's pages. It holds the embedded templates
// and stylesheet, the functions the templates call, the overview's chart and the row page's
// payload. The console's handlers belong to the runtime, in the console files of the root
// package.
package consoleui

import (
	"bytes"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/onceflow/onceflow/internal/metrics"
)

// Assets are the templates in templates/ and the stylesheet in static/.
//
//go:embed templates/*.html static/*
var Assets embed.FS

// pageNames are the templates of templates/, each rendered inside layout.html.
var pageNames = []string{"overview", "inbox", "row", "replay", "replays", "outbox", "message", "login"}

// Pages parses the pages and returns them by name. The names are overview, inbox, row,
// replay, replays, outbox, message and login.
func Pages() (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, n := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(Assets, "templates/layout.html", "templates/parts.html", "templates/outage.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[n] = t
	}
	return out, nil
}

var funcs = template.FuncMap{
	"visible": Visible,
	"text":    VisibleText,
	"cut":     Cut,
	"when":    when,
	"ago":     func(t time.Time) string { return age(time.Since(t)) },
	"age":     age,
	"num":     num,
	"total":   func(c metrics.MinuteCount) int64 { return c.Total() },
	"failed":  func(c metrics.MinuteCount) int64 { return c.Quarantined + c.Conflict },
	"inc":     func(n int64) int64 { return n + 1 },
}

// Visible makes s safe to show on one line. It writes some runes and bytes as Go escapes,
// such as \x1b, \n, \u202e and \xff. These are control characters, terminal escapes among
// them, and line breaks. They are also the bidirectional overrides that reorder what is
// shown, and bytes that are not UTF-8. html/template then escapes what is left for HTML.
func Visible(s string) string { return escapeText(s, false) }

// VisibleText is Visible for a block of text, where line breaks and tabs stay.
func VisibleText(s string) string { return escapeText(s, true) }

func escapeText(s string, multiline bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || hidden(r, multiline) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' && !multiline:
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t' && !multiline:
			b.WriteString(`\t`)
		case hidden(r, multiline) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case hidden(r, multiline):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// hidden reports whether r would not show as itself. Such a rune is a C0 or C1 control,
// DEL, or a bidirectional control.
func hidden(r rune, multiline bool) bool {
	switch {
	case multiline && (r == '\n' || r == '\t'):
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Cut shortens s to n runes, ending it with "…".
func Cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func when(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

// age writes d the way an operator reads it, such as 850ms, 42s, 3m10s, 2h05m or 3d04h.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// Num writes n with thousands separators, such as 1,234,567.
func Num(n int64) string { return num(n) }

func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// payloadCap is how much of a payload the row page shows.
const payloadCap = 64 << 10

// PayloadView is a payload as the row page shows it.
type PayloadView struct {
	Text      string // JSON pretty-printed, or the text as it is (escaped by VisibleText)
	Hex       string // a hex dump, for a payload that is not UTF-8
	JSON      bool
	Size      int   // bytes stored
	Shown     int   // bytes shown (Size when not capped)
	Original  int64 // the value's size when only a prefix of it is stored; 0 otherwise
	Tombstone bool
}

// ViewPayload is payload p of a row. original is the value's size when p is only its
// prefix.
func ViewPayload(p []byte, original int64, tombstone bool) PayloadView {
	v := PayloadView{Size: len(p), Shown: len(p), Original: original, Tombstone: tombstone}
	if len(p) == 0 {
		return v
	}
	if len(p) <= payloadCap && json.Valid(p) {
		var b bytes.Buffer
		if json.Indent(&b, p, "", "  ") == nil {
			v.Text, v.JSON = VisibleText(b.String()), true
			return v
		}
	}
	shown := p
	if len(shown) > payloadCap {
		shown = shown[:payloadCap]
		for len(shown) > 0 && !utf8.Valid(shown) && utf8.Valid(p[:min(len(p), payloadCap+utf8.UTFMax)]) {
			shown = shown[:len(shown)-1] // do not cut a character in two
		}
	}
	v.Shown = len(shown)
	if utf8.Valid(shown) {
		v.Text = VisibleText(string(shown))
		return v
	}
	if len(shown) > 4096 {
		shown = shown[:4096]
		v.Shown = len(shown)
	}
	v.Hex = hex.Dump(shown)
	return v
}

// KV is one header of a row.
type KV struct{ K, V string }

// SortedHeaders are a row's headers in key order.
func SortedHeaders(m map[string]string) []KV {
	out := make([]KV, 0, len(m))
	for k, v := range m {
		out = append(out, KV{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].K < out[j].K })
	return out
}

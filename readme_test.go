package onceflow_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines bounds README: the quick path and the guarantees, with the detail in docs/.
const readmeMaxLines = 300

func TestREADMELength(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move detail into docs/ and link to it", n, readmeMaxLines)
	}
}

// Every relative link of README (and of the plugin guide) names a file that exists and, with a
// #fragment into a markdown file, one of its headings.
func TestREADMELinks(t *testing.T) {
	for _, page := range []string{"README.md", "docs/PLUGINS.md"} {
		text := readPage(t, page)
		links := 0
		for _, m := range markdownLink.FindAllStringSubmatch(prose(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			file, fragment, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.ToSlash(filepath.Join(filepath.Dir(page), filepath.FromSlash(file)))
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s, which does not exist", page, target)
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if !anchors(readPage(t, path))[fragment] {
				t.Errorf("%s links to %s: %s has no heading with the anchor #%s", page, target, path, fragment)
			}
		}
		if links == 0 {
			t.Errorf("%s: no relative link found", page)
		}
	}
}

var (
	markdownLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	codeSpan     = regexp.MustCompile("`[^`\n]*`")
)

func readPage(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// prose is a markdown page without its code blocks and code spans, where a link is only text.
func prose(text string) string {
	var out strings.Builder
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out.WriteString(codeSpan.ReplaceAllString(l, "") + "\n")
		}
	}
	return out.String()
}

// anchors are the fragments a markdown page's headings get, as GitHub makes them: the heading
// in lower case, without punctuation, spaces as hyphens, a repeated one numbered from -1.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
		}
		heading := strings.TrimLeft(l, "#")
		if fenced || heading == l || !strings.HasPrefix(heading, " ") {
			continue
		}
		var slug strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			seen[s+"-"+strconv.Itoa(n)]++
		}
		seen[s]++
	}
	out := map[string]bool{}
	for s := range seen {
		out[s] = true
	}
	return out
}

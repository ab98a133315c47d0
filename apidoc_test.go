package onceflow

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const (
	publicAPIStart = "<!-- public-api:start -->"
	publicAPIEnd   = "<!-- public-api:end -->"
)

// publicAPI renders the API of every public package of the module, those outside
// internal/ but main packages: per package, its path and what `go doc -short` prints.
func publicAPI(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Name}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, name, _ := strings.Cut(l, " ")
		rel := strings.TrimPrefix(strings.TrimPrefix(path, "github.com/onceflow/onceflow"), "/")
		if name == "main" || rel == "internal" || strings.HasPrefix(rel, "internal/") || strings.Contains(rel, "/internal/") {
			continue
		}
		doc, err := exec.Command("go", "doc", "-short", path).Output()
		if err != nil {
			t.Fatalf("go doc -short %s: %v", path, err)
		}
		title := "`" + rel + "`"
		if rel == "" {
			title = "`onceflow` (the root package)"
		}
		fmt.Fprintf(&b, "\n### %s\n\n```go\n%s```\n", title, doc)
	}
	return b.String()
}

// docs/ARCHITECTURE.md lists the public API of every public package as `go doc -short`
// prints it, so a change of a package's API shows in review: an exported name added,
// removed or changed and not regenerated (or the reverse) fails here.
func TestPublicAPIListed(t *testing.T) {
	const path = "docs/ARCHITECTURE.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	s, e := strings.Index(doc, publicAPIStart), strings.Index(doc, publicAPIEnd)
	if s < 0 || e < s {
		t.Fatalf("%s has no region %s … %s", path, publicAPIStart, publicAPIEnd)
	}
	s += len(publicAPIStart)
	want := publicAPI(t) + "\n"
	if doc[s:e] == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(doc[:s]+want+doc[e:]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: public API rewritten", path)
		return
	}
	got := strings.Split(doc[s:e], "\n")
	for i, l := range strings.Split(want, "\n") {
		if i >= len(got) || got[i] != l {
			t.Errorf("%s's public API differs from go doc at line %d:\n got: %s\nwant: %s", path, i, at(got, i), l)
			break
		}
	}
	t.Errorf("%s's public API is not what go doc prints: regenerate it with\n\tgo test . -run TestPublicAPIListed -update", path)
}

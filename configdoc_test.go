package onceflow

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite README's configuration table from the settings")

const (
	configTableStart = "<!-- config-table:start -->"
	configTableEnd   = "<!-- config-table:end -->"
)

// README's configuration table is the settings' rendering: a key, default or help text
// changed in a tag and not in README (or the reverse) fails here.
func TestConfigTable(t *testing.T) {
	const path = "README.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	s, e := strings.Index(readme, configTableStart), strings.Index(readme, configTableEnd)
	if s < 0 || e < s {
		t.Fatalf("README.md has no region %s … %s", configTableStart, configTableEnd)
	}
	s += len(configTableStart)
	want := "\n" + configTable()
	if readme[s:e] == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(readme[:s]+want+readme[e:]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("README.md: configuration table rewritten")
		return
	}
	got := strings.Split(readme[s:e], "\n")
	for i, l := range strings.Split(want, "\n") {
		if i >= len(got) || got[i] != l {
			t.Errorf("README.md's configuration table differs from the settings at line %d:\n got: %s\nwant: %s", i, at(got, i), l)
			break
		}
	}
	t.Errorf("README.md's configuration table is not the rendering of the settings: regenerate it with\n\tgo test . -run TestConfigTable -update")
}

func at(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(missing)"
}

package onceflow

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/settings"
)

var update = flag.Bool("update", false, "rewrite the documents' generated parts: README's configuration table, ARCHITECTURE's public API")

const (
	configTableStart = "<!-- config-table:start -->"
	configTableEnd   = "<!-- config-table:end -->"
)

// README's configuration table is the settings' rendering, the bundled plugins' included: a
// key, default or help text changed in a tag and not in README (or the reverse) fails here.
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
	want := "\n" + configTable(inbox.RegisteredPlugins())
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

// README's configuration table has a row for each setting of the bundled plugins, with the
// variable that sets it.
func TestConfigTableListsPluginSettings(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range inbox.RegisteredPlugins() {
		if p.Settings == nil {
			continue
		}
		for _, s := range settings.List(p.Settings) {
			n++
			key := pluginKey(p.Name, s.Key)
			if row := "| `" + key + "` | `" + envName(key) + "` |"; !strings.Contains(string(b), row) {
				t.Errorf("README.md's configuration table has no row %s", row)
			}
		}
	}
	if n == 0 {
		t.Fatal("no bundled plugin declares a setting")
	}
}

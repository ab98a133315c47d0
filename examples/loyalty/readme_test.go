package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The plugin guide in the repository's README shows this module's files: each code block of
// its "Writing a handler plugin" section but the shell one is one of them (the main package,
// the plugin, its migration and its grants file), verbatim, so the README's examples compile
// (this module builds them) and cannot drift from them; docs/PLUGINS.md shows the first unit
// test likewise.
func TestREADMEShowsTheExampleFiles(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "## Writing a handler plugin\n")
	if start < 0 {
		t.Fatal(`README has no "## Writing a handler plugin" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	files := map[string]string{}
	for _, f := range []string{"points/migrations/00001_loyalty.sql", "points_credit", "points_balance"} {
		if !strings.Contains(section, f) {
			t.Errorf("the plugin guide does not name %s", f)
		}
	}
	for _, f := range []string{"main.go", "points/points.go", "points/migrations/00001_loyalty.sql", "points/migrations/grants.txt"} {
		b, err := os.ReadFile(filepath.FromSlash(f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	blocks := regexp.MustCompile("(?s)```(go|sql|text)\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) != len(files) {
		t.Fatalf("the plugin guide has %d go/sql/text code blocks, want %d (the example's files)", len(blocks), len(files))
	}
	for i, b := range blocks {
		found := false
		for name, body := range files {
			if b[2] == body {
				found = true
				delete(files, name)
				break
			}
		}
		if !found {
			t.Errorf("code block %d of the plugin guide (%s, %d bytes) is none of examples/loyalty's files: copy the file into the README", i+1, b[1], len(b[2]))
		}
	}
}

func TestPluginsGuideShowsTheUnitTest(t *testing.T) {
	guide, err := os.ReadFile("../../docs/PLUGINS.md")
	if err != nil {
		t.Fatal(err)
	}
	test, err := os.ReadFile(filepath.FromSlash("points/handler_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(guide), "```go\n"+string(test)+"```\n") {
		t.Fatal("docs/PLUGINS.md does not show points/handler_test.go verbatim: copy the file into it")
	}
}

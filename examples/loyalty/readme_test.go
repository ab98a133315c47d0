package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// codeBlock is a go, sql or text code block of a markdown page: its language and its text.
var codeBlock = regexp.MustCompile("(?s)```(go|sql|text)\n(.*?)```")

// section is the text of a markdown page's section under heading, up to the next "## ".
func section(t *testing.T, path, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, heading+"\n")
	if start < 0 {
		t.Fatalf("%s has no %q section", path, heading)
	}
	s := text[start+1:]
	if end := strings.Index(s, "\n## "); end >= 0 {
		s = s[:end]
	}
	return s
}

// exampleFiles are the module's files the guides show, by name.
func exampleFiles(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, f := range []string{"main.go", "points/points.go", "points/migrations/00001_loyalty.sql", "points/migrations/grants.txt"} {
		b, err := os.ReadFile(filepath.FromSlash(f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	return files
}

// The plugin guide, docs/PLUGINS.md, shows this module's files: each go, sql or text code block
// of its "The example plugin, file by file" section is one of them (the main package, the
// plugin, its migration and its grants file), verbatim, so the guide's listings compile (this
// module builds them) and cannot drift from them.
func TestPluginsGuideShowsTheExampleFiles(t *testing.T) {
	s := section(t, "../../docs/PLUGINS.md", "## The example plugin, file by file")
	files := exampleFiles(t)
	for name := range files {
		if !strings.Contains(s, "`"+name+"`") {
			t.Errorf("the guide's example section does not name %s", name)
		}
	}
	for _, table := range []string{"points_credit", "points_balance"} {
		if !strings.Contains(s, table) {
			t.Errorf("the guide's example section does not name %s", table)
		}
	}
	blocks := codeBlock.FindAllStringSubmatch(s, -1)
	if len(blocks) != len(files) {
		t.Fatalf("the guide's example section has %d go/sql/text code blocks, want %d (the example's files)", len(blocks), len(files))
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
			t.Errorf("code block %d of the guide's example section (%s, %d bytes) is none of examples/loyalty's files: copy the file into docs/PLUGINS.md", i+1, b[1], len(b[2]))
		}
	}
}

// The README's plugin section shows excerpts of this module's files: each go, sql or text code
// block there, split at lines that are only "// …", is a run of lines of one of the files.
func TestREADMEExcerptsTheExample(t *testing.T) {
	s := section(t, "../../README.md", "## Writing a handler plugin")
	if !strings.Contains(s, "](docs/PLUGINS.md") {
		t.Error("the README's plugin section does not link to docs/PLUGINS.md")
	}
	files := exampleFiles(t)
	for i, b := range codeBlock.FindAllStringSubmatch(s, -1) {
		var part strings.Builder
		check := func() {
			defer part.Reset()
			if part.Len() == 0 {
				return
			}
			for _, body := range files {
				if strings.HasPrefix(body, part.String()) || strings.Contains(body, "\n"+part.String()) {
					return
				}
			}
			t.Errorf("code block %d of the README's plugin section (%s) has lines that are in none of examples/loyalty's files:\n%s", i+1, b[1], part.String())
		}
		for _, l := range strings.SplitAfter(b[2], "\n") {
			if strings.TrimSpace(l) == "// …" {
				check()
				continue
			}
			part.WriteString(l)
		}
		check()
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
